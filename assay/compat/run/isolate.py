"""Run one probe in its own process: a hang, a segfault, an OOM kill or an exception there is a row here.

The parent plans the probe (plan_probe) before starting the child and hands it the plan as JSON (worker.py
runs it as given, planning nothing again), so even a child that dies without a word leaves a row with the
model, the stack, the run.py and the reason it died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from assay.compat.probe.request import ProbePlan, says_out_of_memory
from assay.compat.probe.stages import PREFIXES, PROGRESS_ENV
from assay.core.process import die_with_parent, limit_address_space

if TYPE_CHECKING:
    from assay.compat.run.zygote import Zygote

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
    relay: TextIO | None = None,
) -> dict:
    """Run the probe of `plan` in a child process and return its row, whatever happened to the child.

    env: added to the child's environment (ASSAY_PLUGINS there is how tests stage compilers that hang,
    crash or hoard memory: tests/helpers/misbehaving_backends.py). zygote: fork the child from this pre-imported process instead of
    starting a fresh interpreter (a sweep's default; see zygote.py); the child is isolated the same way.
    relay: the child reports its stages (probe/stages.py) and they are copied here as they come.
    """
    if relay is not None:
        env = (env or {}) | {PROGRESS_ENV: "1"}
    row = dict(plan.row)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="assay-probe-") as scratch:
        plan_file = Path(scratch) / "plan.json"
        result_file = Path(scratch) / "row.json"
        stderr_file = Path(scratch) / "stderr.txt"
        plan_file.write_text(plan.to_json())
        stderr_file.touch()
        relaying = _Relay(stderr_file, relay) if relay is not None else None
        if zygote is not None:
            pid = zygote.spawn("assay.compat.run.worker", [str(plan_file), str(result_file)], stderr_file, env, memory_limit_bytes)
            returncode, timed_out = zygote.wait(pid, timeout)
        else:
            argv = [sys.executable, "-m", "assay.compat.run.worker", str(plan_file), str(result_file)]
            returncode, timed_out = run_fresh(argv, os.environ.copy() | (env or {}), stderr_file, memory_limit_bytes, timeout)
        if relaying is not None:
            relaying.stop()
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


def run_fresh(argv: list[str], env: dict, stderr_file: Path, memory_limit_bytes: int | None, timeout: float | None, cwd: Path | None = None) -> tuple[int, bool]:
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



class _Relay:
    """Copies the child's progress lines from its stderr file to `stream` while it runs (and the rest at stop)."""

    def __init__(self, path: Path, stream: TextIO):
        self._file, self._stream = open(path, "rb"), stream
        self._done = threading.Event()
        self._buffer = b""
        self._thread = threading.Thread(target=self._run, name="probe-progress", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        self._buffer += self._file.read()
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace")
            if text.startswith(PREFIXES):
                self._stream.write(text + "\n")
                self._stream.flush()

    def _run(self) -> None:
        while not self._done.wait(0.2):
            self._copy()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._copy()
        self._file.close()
