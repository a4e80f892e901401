"""Comma-separated flag values (`--pairs 8,32,128`, `--buckets 1,2,4`), parsed once for every command.

A bad item is an AssayError naming the flag and the item, which the CLI prints as one line (exit 2).
"""

from __future__ import annotations

from typing import Callable, TypeVar

from assay.core.errors import AssayError

T = TypeVar("T")
_KINDS = {int: "an integer", float: "a number", str: "a name"}


def comma_list(flag: str, text: str | None, convert: Callable[[str], T] = str, required: bool = True) -> tuple[T, ...]:
    """ "8, 32,128" -> (8, 32, 128) with convert=int. Empty items are dropped; no item at all is an
    error when `required` (else an empty tuple)."""
    items = [item.strip() for item in str(text or "").split(",") if item.strip()]
    if not items:
        if required:
            raise AssayError(f"{flag} {text!r}: expected a comma-separated list such as 1,2,4")
        return ()
    values = []
    for item in items:
        try:
            values.append(convert(item))
        except ValueError:
            raise AssayError(f"{flag} {text!r}: {item!r} is not {_KINDS.get(convert, 'valid')}") from None
    return tuple(values)
