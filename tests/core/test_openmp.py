"""OpenMP worker teams: release_openmp_workers ends the calling thread's team, and the serving engine's loop
releases the loading thread's before its own thread steps the model (core/openmp.py says why: with two teams
on a machine of two CPUs, libgomp stops spinning and a decode step took 1.7x as long).

Each case runs in a fresh interpreter: a team, once made, lives as long as its thread, and pytest's own
process has made some. The teams are counted as the process's OS threads (/proc/self/task): a team of
2 threads is its owner and 1 worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


from assay.core.openmp import loaded_libgomp, release_openmp_workers

# Counts the process's threads once they settle: a released worker leaves /proc a moment after the pause returns.
_COUNT = """
import os, time
def threads(expected=None):
    deadline = time.monotonic() + 5
    while True:
        count = len(os.listdir("/proc/self/task"))
        if count == expected or time.monotonic() > deadline or expected is None:
            return count
        time.sleep(0.01)
"""


def _run(body: str) -> dict:
    script = textwrap.dedent(_COUNT) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_released_team_ends_and_the_next_parallel_region_makes_one_for_its_own_thread():
    seen = _run("""
        import json, threading, torch
        from assay.core.openmp import loaded_libgomp, release_openmp_workers
        torch.set_num_threads(2)
        big = torch.rand(4_000_000)  # an elementwise op this long runs as one parallel region of 2 threads
        alone = threads()
        big.exp()
        with_team = threads(alone + 1)
        released = release_openmp_workers()
        after = threads(alone)
        big.exp()
        again = threads(alone + 1)
        print(json.dumps({"libgomp": str(loaded_libgomp()), "alone": alone, "with_team": with_team, "released": released,
                          "after": after, "again": again}))
    """)
    if seen["libgomp"] == "None":  # another runtime: nothing is released, and nothing claims to be
        assert seen["released"] is False
        return
    assert seen["released"] is True
    assert seen["with_team"] == seen["alone"] + 1, seen  # the region left its worker behind
    assert seen["after"] == seen["alone"], seen  # gone once released
    assert seen["again"] == seen["alone"] + 1, seen  # and made again by the next region


def test_every_loaded_libgomp_releases_its_team_not_only_the_first_one_mapped():
    # A wheel that bundles its own libgomp (sentencepiece does; Transformers imports it with a tokenizer) puts a
    # second copy in the process, mapped before PyTorch's: releasing only the first copy left PyTorch's team
    # alive, and the engine thread's decode step ran at half speed. Here a copy of PyTorch's own library, loaded
    # after it, plays that wheel's part.
    seen = _run("""
        import ctypes, json, shutil, tempfile, torch
        from pathlib import Path
        from assay.core.openmp import loaded_libgomps, release_openmp_workers
        torch.set_num_threads(2)
        own = loaded_libgomps()
        if own:
            bundled = Path(tempfile.mkdtemp()) / "libgomp-bundled.so.1"
            shutil.copy(own[0], bundled)
            ctypes.CDLL(str(bundled))
        big = torch.rand(4_000_000)
        alone = threads()
        big.exp()  # PyTorch's copy makes the team
        with_team = threads(alone + 1)
        released = release_openmp_workers()
        after = threads(alone)
        print(json.dumps({"own": [str(p) for p in own], "loaded": [str(p) for p in loaded_libgomps()],
                          "alone": alone, "with_team": with_team, "released": released, "after": after}))
    """)
    if not seen["own"]:  # another runtime: nothing to release
        return
    assert len(seen["loaded"]) == len(seen["own"]) + 1, seen  # the bundled copy is listed beside PyTorch's
    assert seen["released"] is True, seen
    assert seen["with_team"] == seen["alone"] + 1, seen
    assert seen["after"] == seen["alone"], seen  # PyTorch's team ended, though its library is not the first mapped


def test_the_engine_loop_leaves_the_loading_thread_without_a_team(zoo_dir):
    if loaded_libgomp() is None:
        assert release_openmp_workers() is False
        return
    seen = _run(f"""
        import json, torch
        from assay.serve import Engine, EngineConfig
        from assay.serve.engine.loop import EngineLoop
        from assay.serve.runner.weights import load_slot_model
        torch.set_num_threads(2)
        model = load_slot_model({str(zoo_dir / "qwen3")!r}, torch.device("cpu"), 64)
        engine = Engine(model, EngineConfig(max_seqs=2, buckets=(1, 2), eager=True, max_len=64))
        torch.rand(4_000_000).exp()  # the loading thread has a team (loading may have made it already)
        loaded = threads()
        loop = EngineLoop(engine)
        loop.start()  # one thread more (the engine's), one fewer (the loading thread's worker)
        started = threads(loaded)
        loop.stop()
        print(json.dumps({{"loaded": loaded, "started": started}}))
    """)
    assert seen["started"] == seen["loaded"], seen
