"""Set-up of a process that does one job: a child for a parent (a probe, a rank: the same in a forked child and
in a fresh interpreter's preexec_fn), or a server once it has loaded what it serves."""

from __future__ import annotations

import gc
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


def freeze_startup_heap() -> int:
    """A full collection, then every object still alive moved to the collector's permanent generation (gc.freeze,
    as vLLM does once its engine is up); the number frozen. For a process that has finished setting up and only
    serves from now on: a model compiled with torch.compile leaves about a million long-lived objects (dynamo's and
    inductor's graphs, guards, sympy expressions of dynamic shapes), and each full collection walked them all,
    a pause of most of a second in whichever request it fell on. Frozen objects are never collected: call it
    once, after set-up, not in a process that keeps making and dropping models (a test runner)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
