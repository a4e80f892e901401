"""The probe's progress on stderr: each stage named as it starts, the eval's items as they are scored.

Silent unless switched on: `assay probe` switches it on (a sweep's probes stay silent, their stderr is a
row's error tail). A probe in its own process switches it on from ASSAY_PROBE_PROGRESS, and the parent
relays its lines (run/isolate.py). On a terminal the eval's item count is redrawn in place; otherwise
(a log, a pipe) every line is a whole line, one every few seconds at most for the item count.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

PROGRESS_ENV = "ASSAY_PROBE_PROGRESS"
PREFIXES = ("probe ", "eval ")  # what a relaying parent picks out of a child's stderr
LOG_EVERY_S = 5.0  # a log gets the item count at most this often (and at the end)
REDRAW_EVERY_S = 0.2

_stream: TextIO | None = None
_started = 0.0
_items_last = 0.0
_items_open = False  # a terminal line being redrawn, not yet ended
_items_task = None


def enable(stream: TextIO | None = None) -> None:
    """Report on `stream` (stderr by default) from now on in this process."""
    global _stream, _started
    _stream = stream or sys.stderr
    _started = time.perf_counter()


def enable_from_env() -> None:
    if os.environ.get(PROGRESS_ENV):
        enable()


def _tty() -> bool:
    return bool(getattr(_stream, "isatty", lambda: False)())


def _write(text: str) -> None:
    global _items_open
    if _items_open:  # end the redrawn line first
        text = "\n" + text
        _items_open = False
    _stream.write(text + "\n")
    _stream.flush()


def stage(model: str, name: str, detail: str = "") -> None:
    """`probe MODEL: NAME (DETAIL)` as the stage starts, with the seconds since the probe began."""
    if _stream is None:
        return
    _write(f"probe {model}: {name}" + (f" ({detail})" if detail else "") + f" [{time.perf_counter() - _started:.0f} s]")


def items(task: str, done: int, total: int) -> None:
    """`eval TASK: DONE/TOTAL items`: redrawn on a terminal, a line every few seconds (and the last) otherwise."""
    global _items_last, _items_open, _items_task
    if _stream is None:
        return
    now = time.perf_counter()
    if task != _items_task:  # every task's first count is shown
        _items_task, _items_last = task, 0.0
    last = done >= total
    if _tty():
        if last or now - _items_last >= REDRAW_EVERY_S:
            _items_last = now
            _stream.write(f"\reval {task}: {done}/{total} items")
            _items_open = not last
            if last:
                _stream.write("\n")
            _stream.flush()
    elif last or now - _items_last >= LOG_EVERY_S:
        _items_last = now
        _write(f"eval {task}: {done}/{total} items")


def items_callback(label: str):
    """A progress callback for eval/recipe.py's score_tasks (None when silent: the recipe then reports nothing)."""
    if _stream is None:
        return None
    return lambda task, done, total: items(f"{task} ({label})", done, total)
