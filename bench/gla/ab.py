"""gla_chunk now vs as of a git revision, A/B in one process: forward (no grad) and forward+backward.

    python bench/gla/ab.py --rev 3714d75 --threads 2 [--gate /16] [--dtype float32]   -> bench/results/gla_ab.json, a table

The revision's kernel is loaded from git next to the working tree's (bench/gla/revision.py: the old
single file or the package), so both run in one process on the same inputs. --gate picks the gate
strength (bench/gla/gates.py's names; the model's /16 by default: the weak-gate regression check).

For a loaded machine, where bench/gla/kernel.py's best-of-rounds is noisy: many rounds, each timing every
(version, mode) once in a new random order, medians and quartiles as well as minima, and the load
average. --wipe touches 256 MB before every call, so that each starts with cold caches (as after
bench/gla/kernel.py's SDPA rows). Width as bench/gla/kernel.py: B=1, H=4, K=V=64, float32, C=64.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import random
import statistics
import time

import torch

from assay.core.files import atomic_write_json
from assay.core.metrics import measure_peak_flops
from assay.core.output import print_table
from assay.ops import gla_chunk
from bench.common import RESULTS
from bench.gla.kernel import CHUNK, floor_flops
from bench.gla.gates import call as time_call
from bench.gla.gates import make_inputs
from bench.gla.revision import load_gla_chunk


def run(before_rev: str, time_steps: int, rounds: int, wipe: bool, gate: str = "/16", dtype: torch.dtype = torch.float32) -> dict:
    versions = {"now": gla_chunk, before_rev: load_gla_chunk(before_rev)}
    inputs = make_inputs(time_steps, gate, dtype)
    leaves = [x.clone().requires_grad_() for x in inputs]
    scratch = torch.zeros(64 * 2**20) if wipe else None

    def call(fn, mode):  # gla_gates.call: forward under no_grad, or forward+backward from fresh leaves
        time_call(fn, inputs if mode == "fwd" else leaves, mode)

    jobs = [(name, mode) for name in versions for mode in ("fwd", "fwd+bwd")]
    for name, mode in jobs:  # warm-up
        call(versions[name], mode)
    times = {job: [] for job in jobs}
    loads, rates = [], []
    for round_index in range(rounds):
        rates.append(measure_peak_flops("cpu", n=512, repeats=3))
        loads.append(os.getloadavg()[0])
        order = jobs[:]
        random.Random(round_index).shuffle(order)
        for name, mode in order:
            if scratch is not None:
                scratch.add_(1.0)
            start = time.perf_counter()
            call(versions[name], mode)
            times[(name, mode)].append(time.perf_counter() - start)
    rate = max(rates)
    rows = []
    for (name, mode), samples in times.items():
        quartiles = statistics.quantiles(samples, n=4)
        floor = floor_flops(time_steps, mode) / rate
        rows.append({
            "version": name, "mode": mode, "T": time_steps, "min_s": min(samples), "q1_s": quartiles[0],
            "median_s": quartiles[1], "runs": len(samples), "floor_s": floor, "median_times_floor": quartiles[1] / floor,
        })
    return {
        "config": {
            "before": before_rev, "T": time_steps, "rounds": rounds, "wipe_caches": wipe, "threads": torch.get_num_threads(),
            "gate": gate, "dtype": str(dtype).removeprefix("torch."), "cores": os.cpu_count(),
            "chunk_size": CHUNK, "torch": torch.__version__, "loadavg_1min_per_round": loads, "loadavg_end": os.getloadavg(),
        },
        "matmul_rate_flops": rate,
        "rows": rows,
        "median_speedup_vs_before": {
            mode: next(r["median_s"] for r in rows if r["version"] == before_rev and r["mode"] == mode)
            / next(r["median_s"] for r in rows if r["version"] == "now" and r["mode"] == mode)
            for mode in ("fwd", "fwd+bwd")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", "--before", dest="before", default="3714d75", help="git revision whose gla_chunk is the reference")
    parser.add_argument("--gate", default="/16", help="gate strength: /16 (the model's), /4, 1x, 4x or wipe (bench/gla/gates.py)")
    parser.add_argument("--dtype", default="float32", help="input dtype: float32 or bfloat16")
    parser.add_argument("--T", type=int, default=4096, help="sequence length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--wipe", action="store_true", help="touch 256 MB before every call (cold caches)")
    parser.add_argument("--out", default=str(RESULTS / "gla_ab.json"), help="JSON path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.before, args.T, args.rounds, args.wipe, args.gate, getattr(torch, args.dtype))
    atomic_write_json(Path(args.out), result)
    table = [
        {"version": r["version"], "mode": r["mode"], "min ms": f"{1000 * r['min_s']:.2f}", "q1 ms": f"{1000 * r['q1_s']:.2f}",
         "median ms": f"{1000 * r['median_s']:.2f}", "median / floor": f"{r['median_times_floor']:.2f}"}
        for r in result["rows"]
    ]
    print_table(table, list(table[0].keys()), title=f"gla_chunk A/B, T={args.T}, gate {args.gate}, {args.dtype}, {args.threads} thread(s)")
    print(f"median speedup vs {args.before}: {result['median_speedup_vs_before']}; load {result['config']['loadavg_end']}")


if __name__ == "__main__":
    sys.exit(main())
