"""Set-up run inside a child process that does one job for a parent (a probe, a rank): the same in a forked
child and in a fresh interpreter's preexec_fn."""

from __future__ import annotations

import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies: a sweep killed with SIGKILL must not leave probes running on.
    (Linux only, and harmless to skip elsewhere.)"""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def limit_address_space(limit_bytes: int | None) -> None:
    """Address-space limit: an allocation past it raises MemoryError in this process (recorded as OOM)
    instead of waking the kernel's OOM killer, which would take other work with it."""
    if limit_bytes:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(limit_bytes), int(limit_bytes)))
