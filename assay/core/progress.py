"""Progress display for long work (rich), silent when not wanted (tests, --json, no terminal)."""

from __future__ import annotations

import contextlib
import functools
import sys
from types import ModuleType
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


@contextlib.contextmanager
def library_bar_off(module: ModuleType) -> Iterator[None]:
    """A library module's own tqdm bars (its module-level `tqdm`, called unconditionally, which no logging
    setting reaches) switched off for the block, while our own progress is what the user sees."""
    original = module.tqdm
    module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        module.tqdm = original
