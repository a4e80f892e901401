"""The sweep's progress on stderr (stdout stays for results): a live line on a terminal, else one line per finished model."""

from __future__ import annotations

import sys
import threading
import time

from assay.compat.results.schema import FAILURES


class SweepProgress:
    """done / failed / running / ETA. A terminal gets a live line redrawn in place; a log or a pipe gets one
    whole line per finished model (a redrawn line there would glue to the next output)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total = total
        self.enabled = enabled and total > 0
        self.done = 0
        self.failed = 0
        self.running: set[str] = set()
        self.started_at = time.perf_counter()
        self._lock = threading.Lock()
        self._live = None
        self._stream = stream or sys.stderr
        self._terminal = bool(getattr(self._stream, "isatty", lambda: False)())

    def __enter__(self) -> "SweepProgress":
        if self.enabled and self._terminal:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._render(), console=Console(file=self._stream), refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def started(self, model: str) -> None:
        with self._lock:
            self.running.add(model)
        self._refresh()

    def finished(self, row: dict) -> None:
        with self._lock:
            self.running.discard(row["model"])
            self.done += 1
            self.failed += row["status"] in FAILURES
            line = self._finished_line(row)
        if self.enabled and not self._terminal:
            self._stream.write(line + "\n")
            self._stream.flush()
        self._refresh()

    def _finished_line(self, row: dict) -> str:
        eta = self.eta_s()
        seconds = f" in {row['total_s']:.0f} s" if row.get("total_s") is not None else ""
        return (f"sweep: {self.done}/{self.total} {row['status']} {row['model']}{seconds} ({self.failed} failed, "
                f"elapsed {time.perf_counter() - self.started_at:.0f} s, ETA {'-' if eta is None else f'{eta:.0f} s'})")

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        elapsed = time.perf_counter() - self.started_at
        return elapsed / self.done * (self.total - self.done)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self):
        from rich.text import Text

        eta = self.eta_s()
        eta_text = "-" if eta is None else f"{eta:.0f} s"
        running = ", ".join(sorted(self.running)[:4]) + (" ..." if len(self.running) > 4 else "")
        return Text(
            f"sweep: {self.done}/{self.total} done, {self.failed} failed, {len(self.running)} running "
            f"[{running}], elapsed {time.perf_counter() - self.started_at:.0f} s, ETA {eta_text}"
        )
