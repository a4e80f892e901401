"""Printing results: a rich table by default, JSON with --json. Commands never print any other way."""

from __future__ import annotations

import json
import sys
from typing import Iterable, Sequence


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def print_table(
    rows: Iterable[dict], columns: Sequence[str], title: str | None = None, styles: dict | None = None,
    headers: dict | None = None,
) -> None:
    """columns: the keys to show; headers: short names for some of them."""
    from rich.table import Table

    table = Table(title=_escape(title) if title else None, show_lines=False)
    for column in columns:
        table.add_column((headers or {}).get(column, column), overflow="fold")
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            text = _format(value)
            style = (styles or {}).get(column, {}).get(str(value))
            cells.append(f"[{style}]{_escape(text)}[/]" if style else _escape(text))
        table.add_row(*cells)
    console().print(table)


def console():
    """A console for stdout: the terminal's width, or a wide page when piped (no folding in logs)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _format(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def print_key_values(pairs: dict, title: str | None = None) -> None:
    print_table(({"field": k, "value": v} for k, v in pairs.items()), ["field", "value"], title=title)


STATUS_STYLES = {
    "status": {
        "PASS": "green",
        "SKIPPED": "cyan",
        "FAIL_ACCURACY": "yellow",
        **{s: "red" for s in ("FAIL_LOAD", "FAIL_COMPILE", "FAIL_RUN", "OOM", "TIMEOUT", "CRASH")},
    }
}
