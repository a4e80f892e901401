"""Run one probe in its own process: a hang, a segfault, an OOM kill or an exception there is a row here.

The parent lays out the row (plan_probe) before starting the child, so even a child that dies
without a word leaves a row with the model, the stack, the run.py and the reason it died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from assay.compat.request import ProbePlan, request_from_json, says_out_of_memory  # noqa: F401  (request_from_json: the worker's)
from assay.core.process import die_with_parent, limit_address_space

if TYPE_CHECKING:
    from assay.compat.zygote import Zygote

STDERR_TAIL = 4000


def _child_setup(limit_bytes: int | None):
    def apply() -> None:
        die_with_parent()
        limit_address_space(limit_bytes)

    return apply


def run_isolated(
    plan: ProbePlan,
    timeout: float | None,
    memory_limit_bytes: int | None = None,
    env: dict | None = None,
    zygote: "Zygote | None" = None,
) -> dict:
    """Run the probe of `plan` in a child process and return its row, whatever happened to the child.

    env: added to the child's environment (ASSAY_PLUGINS there is how tests stage compilers that hang,
    crash or hoard memory: tests/helpers/misbehaving_backends.py). zygote: fork the child from this pre-imported process instead of
    starting a fresh interpreter (a sweep's default; see zygote.py); the child is isolated the same way.
    """
    row = dict(plan.row)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="assay-probe-") as scratch:
        request_file = Path(scratch) / "request.json"
        result_file = Path(scratch) / "row.json"
        stderr_file = Path(scratch) / "stderr.txt"
        request_file.write_text(json.dumps(asdict(plan.request)))
        if zygote is not None:
            pid = zygote.spawn("assay.compat.worker", [str(request_file), str(result_file)], stderr_file, env, memory_limit_bytes)
            returncode, timed_out = zygote.wait(pid, timeout)
        else:
            argv = [sys.executable, "-m", "assay.compat.worker", str(request_file), str(result_file)]
            returncode, timed_out = _run_fresh(argv, os.environ.copy() | (env or {}), stderr_file, memory_limit_bytes, timeout)
        stderr_tail = stderr_file.read_bytes().decode("utf-8", "replace")[-STDERR_TAIL:] if stderr_file.exists() else ""
        if timed_out:
            row.update(status="TIMEOUT", reason=f"killed after the {timeout:g} s time limit", error=stderr_tail or None)
        elif result_file.exists():
            row = json.loads(result_file.read_text())
        elif returncode < 0:
            name = signal.Signals(-returncode).name
            hint = " (the kernel's out-of-memory killer, or killed from outside)" if name == "SIGKILL" else ""
            status = "OOM" if says_out_of_memory(stderr_tail) else "CRASH"
            row.update(status=status, reason=f"probe process killed by {name}{hint}", error=stderr_tail or None)
        else:
            last_line = stderr_tail.strip().splitlines()[-1] if stderr_tail.strip() else ""
            status = "OOM" if says_out_of_memory(stderr_tail) else "CRASH"
            row.update(status=status, reason=f"probe process exited with code {returncode} without a result: {last_line[:300]}", error=stderr_tail or None)
    if row.get("status") in ("TIMEOUT", "CRASH", "OOM") and row.get("total_s") is None:
        row["total_s"] = time.perf_counter() - started
    return row


def _run_fresh(argv: list[str], env: dict, stderr_file: Path, memory_limit_bytes: int | None, timeout: float | None, cwd: Path | None = None) -> tuple[int, bool]:
    """A freshly started interpreter: (returncode, timed_out). cwd: its working folder (default: ours)."""
    with open(stderr_file, "wb") as stderr:
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True, cwd=cwd,
            preexec_fn=_child_setup(memory_limit_bytes),
        )
        try:
            return process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            # The whole process group: a probe that started its own workers takes them along.
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait(), True

