"""Progress display for long work (rich), silent when not wanted (tests, --json, no terminal)."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Yield `advance(label)`; shows a rich bar on stderr when enabled, so stdout stays clean for --json."""
    if not enabled:
        yield lambda label="": None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(file=sys.stderr)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[label]}"), console=console, transient=False,
    ) as bar:
        task = bar.add_task(description, total=total, label="")

        def advance(label: str = "") -> None:
            bar.update(task, advance=1, label=label)

        yield advance
