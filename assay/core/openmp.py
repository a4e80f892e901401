"""OpenMP's worker threads, for code that runs a model on a thread of its own.

GNU OpenMP (libgomp, the runtime PyTorch's Linux CPU builds use for their intra-op threads) keeps a team of
worker threads for every thread that has run a parallel region, and keeps it after the region ends. Once it
manages more threads than the machine has CPUs, its workers stop spinning between regions (libgomp's
"throttled" spin count): every parallel region then waits for workers woken by the kernel. A server that
loads a model on its main thread and steps it on an engine thread has two teams, each as wide as the
machine (PyTorch's default), so each of the hundreds of parallel regions in a decode step pays that
wake-up. Measured on a 2-core Xeon, 2 threads: SmolLM2-135M's compiled one-sequence step 26.4 ms on the
loading thread, 45.8 ms on another thread while the loading thread's team lived; a 1 x 576 by 576 x 1536
linear 30 us against 124 us (`python bench/core/openmp_teams.py`).

`release_openmp_workers()` ends the calling thread's team, so that the thread which steps the model next is
the only one with workers. Other OpenMP runtimes (LLVM's libomp, Intel's) are left alone: this is a no-op there.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t (OpenMP 5.0); libgomp frees the calling thread's team for soft and hard alike


def loaded_libgomp() -> Path | None:
    """The libgomp this process has loaded (PyTorch's bundled copy or the system's), or None: another runtime,
    none loaded yet, or no /proc to ask."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libgomp"):
            return Path(fields[5].strip())
    return None


def release_openmp_workers() -> bool:
    """End the calling thread's OpenMP worker team (libgomp's omp_pause_resource_all); True when one was
    released or there was none to release. The thread gets a new team at its next parallel region, so
    call it on a thread that has finished its parallel work (the one that loaded a model, before another
    thread steps it). Not inside a parallel region; False where the runtime is not libgomp or is too old
    (GCC < 9) to pause."""
    library = loaded_libgomp()
    if library is None:
        return False
    pause = getattr(ctypes.CDLL(str(library)), "omp_pause_resource_all", None)
    if pause is None:
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(_OMP_PAUSE_SOFT) == 0
