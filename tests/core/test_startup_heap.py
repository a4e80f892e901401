"""freeze_startup_heap: once a server has set up, a full collection no longer walks what set-up left alive.

A fresh interpreter each time (a frozen object stays frozen for the life of its process, and pytest's own
process must not freeze what its tests drop later). The heap of a compiled model is played by a million small
objects that refer to each other, as dynamo's and inductor's do; what the collector walks is read from
gc.get_objects(generation=2), the list a full collection scans.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(body: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_set_up_left_alive_is_out_of_a_full_collections_reach_and_garbage_made_later_is_still_collected():
    seen = _run("""
        import gc, json, weakref
        from assay.core.process import freeze_startup_heap
        heap = [[index, None] for index in range(1_000_000)]  # long-lived set-up state
        for index in range(1, len(heap)):
            heap[index][1] = heap[index - 1]
        gc.collect()
        walked_before = len(gc.get_objects(generation=2))
        frozen = freeze_startup_heap()
        walked_after = len(gc.get_objects(generation=2))

        class Node:
            pass
        cycle = Node(); cycle.me = cycle  # garbage made while serving: only a collection frees a cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        print(json.dumps({"frozen": frozen, "walked_before": walked_before, "walked_after": walked_after,
                          "cycle_collected": gone() is None, "heap_alive": len(heap)}))
    """)
    assert seen["walked_before"] >= 1_000_000, seen  # the set-up state was in the full collection's list
    assert seen["frozen"] >= 1_000_000, seen  # and is frozen
    assert seen["walked_after"] < 1_000, seen  # so a full collection walks (almost) nothing of it
    assert seen["cycle_collected"] is True, seen  # the collector still frees what serving drops
    assert seen["heap_alive"] == 1_000_000, seen
