"""Why dynamo split or recompiled a model: graph-break and recompile reasons, short and deduplicated.

Graph breaks come from dynamo's `counters["graph_break"]` (core.compiling.watch collects them into
CompileStats.break_reasons). Recompile reasons are the guard failures dynamo computes before it
recompiles a frame (`torch._dynamo.guards.get_and_maybe_log_recompilation_reasons`, which it logs only
under TORCH_LOGS="recompiles"); `recompile_reasons()` listens to that call while a probe compiles, so
the row has them without turning on dynamo's logging.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

MAX_CHARS = 160
MAX_REASONS = 20


def short(reason: str) -> str:
    """The first non-empty line, whitespace collapsed, cut at MAX_CHARS."""
    line = next((part.strip() for part in str(reason).splitlines() if part.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."


def combine(breaks: list[str], recompiles: list[str]) -> list[str]:
    """The row's compile_reasons: "break: ..." then "recompile: ...", each once, first seen first."""
    seen: dict[str, None] = {}
    for kind, reasons in (("break", breaks), ("recompile", recompiles)):
        for reason in reasons:
            text = short(reason)
            if text:
                seen.setdefault(f"{kind}: {text}", None)
    return list(seen)[:MAX_REASONS]


@contextlib.contextmanager
def recompile_reasons() -> Iterator[list[str]]:
    """Collect the guard-failure reasons of every recompile in the block (one string per failed guard)."""
    import torch._dynamo.convert_frame as convert_frame

    collected: list[str] = []
    original = convert_frame.get_and_maybe_log_recompilation_reasons

    def listening(*args, **kwargs):
        reasons = original(*args, **kwargs)
        for reason in reasons:
            collected.extend(line for line in str(reason).splitlines() if line.strip())
        return reasons

    convert_frame.get_and_maybe_log_recompilation_reasons = listening
    try:
        yield collected
    finally:
        convert_frame.get_and_maybe_log_recompilation_reasons = original
