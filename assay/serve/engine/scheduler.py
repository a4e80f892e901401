"""Which decode width a step runs at: the running count padded up to the next bucket, or exactly it.

A compiled graph has static shapes (the engine compiles with dynamic=False, as the reference system
did), so every distinct width is a separate compilation. With buckets the set of widths is small and
known in advance, so warm-up compiles all of them and no request ever waits for the compiler; without
(`--no-buckets`) each new running count compiles the first time it is seen, in the middle of serving.
"""

from __future__ import annotations

from assay.core.errors import AssayError
from assay.core.values import comma_list

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def parse_buckets(text: str) -> tuple[int, ...]:
    """ "1,2,4,8" -> (1, 2, 4, 8): sorted, unique, each a positive integer; AssayError otherwise."""
    widths = comma_list("--buckets", text, int)
    for width in widths:
        if width < 1:
            raise AssayError(f"--buckets {text!r}: widths must be positive, got {width}")
    return tuple(sorted(set(widths)))


def check_buckets(buckets: tuple[int, ...] | None, max_seqs: int) -> None:
    """Every running count 1..max_seqs must fit a bucket: the largest bucket must be >= max_seqs."""
    if buckets is None:
        return
    if not buckets or any(int(width) < 1 for width in buckets):
        raise AssayError(f"buckets {buckets}: expected positive widths")
    if max(buckets) < max_seqs:
        raise AssayError(f"the largest bucket ({max(buckets)}) is below --max-seqs {max_seqs}: add a bucket >= {max_seqs}")


def decode_width(running: int, buckets: tuple[int, ...] | None) -> int:
    """The batch width a decode step with `running` sequences runs at."""
    if running < 1:
        raise ValueError("no running sequence: nothing to decode")
    if buckets is None:
        return running
    for width in sorted(buckets):
        if width >= running:
            return width
    raise ValueError(f"{running} running sequences exceed the largest bucket {max(buckets)}")


def warm_up_widths(buckets: tuple[int, ...] | None, max_seqs: int) -> list[int]:
    """Widths compiled before serving: exactly those a pool of max_seqs can reach (none without buckets)."""
    if buckets is None:
        return []
    return sorted({decode_width(running, buckets) for running in range(1, max_seqs + 1)})
