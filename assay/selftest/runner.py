"""Run the selftest's parts, each in its own process group, killed past its time limit; record each.

A part that fails, times out or crashes is recorded (status, the error line, seconds) and the run goes
on with the next. The summary (out/selftest.json) is rewritten after every part, so a run killed from
outside still says which parts finished and which never started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from assay.core.files import atomic_path, atomic_write_json
from assay.selftest.parts import Part, SelftestRequest, plan

SUMMARY_FILE = "selftest.json"
SCHEMA_VERSION = 1
PASSED, FAILED, TIMEOUT, NOT_RUN, PENDING = "PASSED", "FAILED", "TIMEOUT", "NOT_RUN", "PENDING"
# A part is not started with less of the run's budget left than this: it could not finish anyway.
MIN_PART_S = 5.0
ERROR_LINE_CHARS = 400


@dataclass
class PartResult:
    name: str
    status: str = PENDING
    seconds: float | None = None
    timeout_s: float | None = None
    returncode: int | None = None
    error: str | None = None  # one line: why it did not pass
    headline: str | None = None  # one line: what it measured
    result: dict | None = None  # the part's findings, from its JSON output
    command: list[str] = field(default_factory=list)
    output: str | None = None  # its JSON stdout, relative to the out folder
    log: str | None = None  # its stderr
    files: list[str] = field(default_factory=list)


@dataclass
class SelftestResult:
    request: SelftestRequest
    backend: str
    budget_s: float
    started_at: str
    parts: list[PartResult]
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float] | None = None
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return all(part.status == PASSED for part in self.parts)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for part in self.parts:
            counts[part.status] = counts.get(part.status, 0) + 1
        return counts

    def as_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "ok": self.ok, "counts": self.counts(), "device": self.request.device,
            "quick": self.request.quick, "backend": self.backend, "budget_s": self.budget_s, "started_at": self.started_at,
            "wall_s": self.wall_s, "python": sys.executable, "zoo": str(self.request.zoo_dir),
            "load_average_start": self.load_average_start, "load_average_end": self.load_average_end,
            "parts": [asdict(part) for part in self.parts],
        }


def run_selftest(request: SelftestRequest) -> SelftestResult:
    from assay.core.device import resolve_backend, resolve_device

    # An absent device or an unknown backend is bad input (exit 2), not a run of failed parts.
    resolve_device(request.device)
    resolve_backend(request.compile_backend)
    parts = plan(request)
    out = request.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    result = SelftestResult(
        request=request, backend=request.compile_backend, budget_s=request.total_budget_s,
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), parts=[PartResult(part.name) for part in parts],
        load_average_start=os.getloadavg(),
    )
    started = time.perf_counter()
    atomic_write_json(out / SUMMARY_FILE, result.as_dict())
    with _Stop.on_signals() as stop:
        _run_parts(parts, result, started + request.total_budget_s, stop)
    result.wall_s = time.perf_counter() - started
    result.load_average_end = os.getloadavg()
    atomic_write_json(out / SUMMARY_FILE, result.as_dict())
    return result


class _Stop:
    """SIGTERM (a job runner's time limit) or SIGINT during the run: the running part's process group is
    killed at once, then the run ends as interrupted. Never an exception raised mid-Popen, which could
    leave a part running on the device with nobody to kill it."""

    def __init__(self) -> None:
        self.requested = False
        self.process: subprocess.Popen | None = None

    @classmethod
    @contextlib.contextmanager
    def on_signals(cls) -> Iterator["_Stop"]:
        stop = cls()
        if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
            yield stop
            return
        previous = {signum: signal.signal(signum, stop.handle) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield stop
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def handle(self, signum, frame) -> None:
        self.requested = True
        self.kill()

    def started(self, process: subprocess.Popen) -> None:
        self.process = process
        if self.requested:  # the signal came while the part was being started
            self.kill()

    def kill(self) -> None:
        """The running part's whole group (process_group=0: its group id is its pid), even once the part
        itself has exited: what it started (compile workers) goes with it."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)


def _run_parts(parts: list[Part], result: SelftestResult, deadline: float, stop: _Stop) -> None:
    from assay.core.progress import progress_bar

    out, shown = result.request.out, result.request.progress
    with progress_bar(f"selftest on {result.request.device}", total=len(parts), enabled=shown) as advance:
        for part, record in zip(parts, result.parts):
            _note(f"{part.name}: running (limit {part.timeout_s:g} s)", shown)
            _run_part(part, record, out, deadline, {p.name: p.status for p in result.parts}, stop)
            if stop.requested:
                record.status, record.error = FAILED, "interrupted"
            atomic_write_json(out / SUMMARY_FILE, result.as_dict())
            if stop.requested:
                raise KeyboardInterrupt
            _note(f"{part.name}: {record.status} in {record.seconds or 0:.1f} s - {record.error or record.headline or ''}", shown)
            advance(f"{part.name} {record.status}")


def _note(line: str, enabled: bool) -> None:
    if enabled:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _run_part(part: Part, record: PartResult, out: Path, deadline: float, statuses: dict[str, str], stop: _Stop) -> None:
    record.command = [sys.executable, *part.argv]
    record.timeout_s = part.timeout_s
    record.files = list(part.files)
    unmet = [name for name in part.needs if statuses.get(name, PASSED) != PASSED]
    if unmet:
        record.status, record.seconds = NOT_RUN, 0.0
        record.error = f"not run: it needs {', '.join(unmet)}, which did not pass"
        return
    left = deadline - time.perf_counter()
    if left < MIN_PART_S:
        record.status, record.seconds = NOT_RUN, 0.0
        record.error = f"not run: the run's time budget was spent ({max(left, 0):.0f} s left)"
        return
    limit = min(part.timeout_s, left)
    record.output, record.log = f"{part.name}.json", f"logs/{part.name}.log"
    started = time.perf_counter()
    returncode, timed_out = _run_process(record.command, out / record.output, out / record.log, limit, stop)
    record.seconds = time.perf_counter() - started
    record.returncode = returncode
    if timed_out:
        record.status = TIMEOUT
        cause = "its time limit" if limit == part.timeout_s else f"the run's time budget ({part.timeout_s:g} s limit)"
        record.error = f"killed after {limit:g} s: {cause}"
        return
    problem = None
    try:
        finding = part.read(json.loads((out / record.output).read_text(encoding="utf-8")))
        record.headline, record.result, problem = finding.headline, finding.result, finding.problem
    except Exception as exc:  # a crashed part prints no JSON; its stderr says why
        problem = None if returncode else f"could not read its output: {type(exc).__name__}: {exc}"
    if returncode or problem:
        record.status = FAILED
        record.error = problem or _error_line(out / record.log) or f"exited with code {returncode}"
    else:
        record.status = PASSED


def _run_process(argv: list[str], stdout_file: Path, log_file: Path, timeout: float, stop: _Stop) -> tuple[int, bool]:
    """(returncode, timed_out). Its own process group: past the limit, the part and every process it started
    go. Not its own session, so a job runner that ends this one's session ends the part with it."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    # Local checkpoints only: a Hub call from a machine with no network would hang until its own timeout.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with atomic_path(stdout_file) as tmp, open(tmp, "wb") as stdout, open(log_file, "wb") as log:
        process = subprocess.Popen(argv, stdout=stdout, stderr=log, stdin=subprocess.DEVNULL, env=env, process_group=0)
        stop.started(process)
        try:
            return process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            stop.kill()
            return process.wait(), True
        finally:
            stop.kill()
            stop.process = None


def _error_line(log_file: Path) -> str | None:
    """The line that says why: the last `error:` line, else the last line (a traceback's exception)."""
    try:
        lines = [line.strip() for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    line = (errors or lines or [None])[-1]
    return line[:ERROR_LINE_CHARS] if line else None
