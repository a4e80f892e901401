"""`assay probe`: one probe, in this process or (with a time or memory limit) in its own, and its row written."""

from __future__ import annotations

import sys
from pathlib import Path

from assay.compat.probe import stages
from assay.compat.probe.execute import execute
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.results.dataset import check_results_target, init_results, write_row


def probe_and_record(request: ProbeRequest, out: str | Path, timeout: float | None = None, memory_limit_bytes: int | None = None,
                     progress: bool = False) -> dict:
    """Probe and write the row. With a timeout or memory limit the probe runs in its own process.
    progress: name each stage on stderr as it starts (probe/stages.py), from whichever process runs it."""
    check_results_target(out)  # a bad --out fails before minutes of work, not after
    plan = plan_probe(request)
    init_results(out)  # created only once the request is known good: bad input leaves nothing behind
    if timeout is None and memory_limit_bytes is None:
        if progress:
            stages.enable()
        row = execute(plan)
    else:
        from assay.compat.run.isolate import run_isolated

        row = run_isolated(plan, timeout=timeout, memory_limit_bytes=memory_limit_bytes, relay=sys.stderr if progress else None)
    write_row(out, row)
    return row
