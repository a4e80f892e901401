"""A test hook: SIGKILL this process at an exact point of training, so that the resume tests need no timing.

    ASSAY_TEST_KILL_AT=step:5             killed in step 5, after backward, before the optimizer step
    ASSAY_TEST_KILL_AT=checkpoint:6       killed while writing checkpoint step-6: after this rank's DCP
                                          shards are on disk, before the checkpoint is committed
    ASSAY_TEST_KILL_AT=checkpoint:6@1     the same on rank 1 only (default: every rank that gets there)

A real crash, not an exception: os.kill(SIGKILL) runs no finally block, flushes nothing and leaves
whatever was half written, as a power cut or the OOM killer would. Unset, the hook costs one dict
lookup per step. Not a user feature: tests/train/test_crash_resume.py drives it.
"""

from __future__ import annotations

import os
import re
import signal
import sys

from assay.core.errors import AssayError

KILL_ENV = "ASSAY_TEST_KILL_AT"
POINTS = ("step", "checkpoint")
_FORMAT = re.compile(r"^(?P<point>[a-z]+):(?P<step>\d+)(?:@(?P<rank>\d+))?$")


def kill_target() -> tuple[str, int, int | None] | None:
    """(point, step, rank or None) from the environment; None when unset. AssayError when malformed."""
    value = os.environ.get(KILL_ENV, "").strip()
    if not value:
        return None
    match = _FORMAT.match(value)
    if not match or match["point"] not in POINTS:
        raise AssayError(f"{KILL_ENV}={value!r}: expected POINT:STEP[@RANK] with POINT one of {', '.join(POINTS)}")
    return match["point"], int(match["step"]), int(match["rank"]) if match["rank"] is not None else None


def kill_point(point: str, step: int, rank: int) -> None:
    """SIGKILL this process when the environment names this point, step (1-based) and rank."""
    if KILL_ENV not in os.environ:
        return
    target = kill_target()
    if target and target[:2] == (point, step) and target[2] in (None, rank):
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
