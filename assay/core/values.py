"""Flag values checked once for every command: comma-separated lists (`--pairs 8,32,128`) and numeric ranges.

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


def at_least(flag: str, value: float | None, minimum: float) -> None:
    """`--steps 0` and friends: a number below its floor is bad input, found before any work. None passes
    (an optional flag that was not given)."""
    if value is not None and not value >= minimum:  # `not >=`: NaN fails too
        raise AssayError(f"{flag} must be at least {minimum:g}, got {value:g}")


def positive(flag: str, value: float | None) -> None:
    """A quantity that must be above zero (a learning rate, a timeout, a memory size)."""
    if value is not None and not value > 0:
        raise AssayError(f"{flag} must be positive, got {value:g}")


def fraction(flag: str, value: float | None) -> None:
    """A ratio from 0 to 1 inclusive."""
    if value is not None and not 0 <= value <= 1:
        raise AssayError(f"{flag} must be between 0 and 1, got {value:g}")
