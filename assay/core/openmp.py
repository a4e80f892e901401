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
the only one with workers. Every libgomp the process has mapped is paused, not only PyTorch's: a wheel may
bundle its own copy (sentencepiece's does), and each copy keeps teams of its own. Other OpenMP runtimes (LLVM's
libomp, Intel's) are left alone: this is a no-op there.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t (OpenMP 5.0); libgomp frees the calling thread's team for soft and hard alike


def loaded_libgomps() -> list[Path]:
    """Every libgomp this process has loaded, in the order /proc/self/maps lists them: PyTorch's bundled copy,
    the system's (inductor's compiled kernels link it), and any a wheel bundles (sentencepiece's does, and
    Transformers imports it with a tokenizer). Empty: another runtime, none loaded yet, or no /proc to ask."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found: list[Path] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libgomp"):
            path = Path(fields[5].strip())
            if path not in found:
                found.append(path)
    return found


def loaded_libgomp() -> Path | None:
    """The first libgomp of loaded_libgomps(), or None where none is loaded."""
    found = loaded_libgomps()
    return found[0] if found else None


def release_openmp_workers() -> bool:
    """End the calling thread's OpenMP worker teams, one per libgomp loaded (each copy keeps its own:
    omp_pause_resource_all); True when every copy released its team or had none. A process may hold several
    copies, and pausing only one would leave the team that steps the model alive (with sentencepiece's copy
    mapped first, a compiled decode step of one sequence took 45-50 ms on the engine thread instead of 21-24:
    the loading thread's PyTorch team lived on). The thread gets a new team at its next parallel region, so
    call it on a thread that has finished its parallel work (the one that loaded a model, before another
    thread steps it). Not inside a parallel region; False where no libgomp is loaded or one is too old
    (GCC < 9) to pause."""
    libraries = loaded_libgomps()
    if not libraries:
        return False
    released = True
    for library in libraries:
        pause = getattr(ctypes.CDLL(str(library)), "omp_pause_resource_all", None)
        if pause is None:
            released = False
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        released = pause(_OMP_PAUSE_SOFT) == 0 and released
    return released
