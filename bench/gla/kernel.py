"""GLA on CPU: gla_chunk (eager, compiled, and as of a base commit) vs the step-by-step reference vs
softmax attention, over sequence length, against the matmul floor.

    python bench/gla/kernel.py            -> bench/results/gla_kernel.json, bench/results/gla_kernel.png, a table

Width B=1, H=4, K=V=64 in float32; softmax attention is torch SDPA (causal) of the same width.
- "before": gla_chunk as of --before (default 2e46294, the commit before the rewrite), loaded from
  git into this process, so before and after are timed in the same run under the same load.
- Matmul floor: the chunk form's matmul FLOPs, 2 T H (C K + C V + 2 K V) forward (3x that for
  forward+backward), at the best matmul rate measured in this run (a 512^3 matmul timed before
  every round). "% floor" = floor time / measured time.
- Interleaved: every round times each op once, in a new random order; times are the best round (a shared machine
  disturbs runs, never speeds them up); medians and the load average of every round are recorded.
- Memory: bytes autograd keeps for the backward (saved tensors, unique storages) at the longest T.
- flash-linear-attention's naive forms (fla.ops.gla.naive) are timed when fla is installed.
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
import torch.nn.functional as F

from assay.core.compiling import compile_fn
from assay.core.files import atomic_write_json
from assay.core.metrics import measure_peak_flops, new_figure, save_figure
from assay.core.numerics import rel_error
from assay.core.output import print_table
from assay.ops import gla_chunk, gla_recurrent
from bench.gla.revision import load_gla_chunk
from bench.common import RESULTS

BATCH, HEADS, KEY_DIM, VALUE_DIM = 1, 4, 64, 64
LENGTHS = [1024, 4096, 16384]
CHUNK = 64
# The step loop's tokens/s does not depend on T (and its backward keeps all T states): past these
# lengths it only costs minutes. Compiling unrolls the chunk loop: compile time grows with T.
MAX_T = {
    ("gla_recurrent", "fwd"): 1024, ("gla_recurrent", "fwd+bwd"): 1024,
    ("fla_naive_recurrent", "fwd"): 1024, ("fla_naive_recurrent", "fwd+bwd"): 1024,
    ("gla_chunk compiled", "fwd"): 4096, ("gla_chunk compiled", "fwd+bwd"): 4096,
}
SLOW_OPS = {"gla_recurrent", "fla_naive_recurrent"}
# The base commit's chunk form with backward: 10x slower than now, minutes per run at 16K.
BEFORE_MAX_T = {"fwd": 16384, "fwd+bwd": 4096}


def make_inputs(time_steps: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)
    k = torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)
    v = torch.randn(BATCH, time_steps, HEADS, VALUE_DIM, generator=generator)
    # GLA's usual gate: logsigmoid(x) / 16, a slow forget (the paper's normaliser).
    g = F.logsigmoid(torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)) / 16
    return q, k, v, g


def load_before(rev: str):
    """gla_chunk as of git revision `rev` (bench/gla/revision.py: single-file or package layout)."""
    return load_gla_chunk(rev)


def fla_naive():
    """fla's pure-PyTorch GLA forms, {name: fn(q, k, v, g) -> o}, or {} when fla is not installed."""
    try:
        from fla.ops.gla import naive as fla_naive_module
    except ImportError:
        return {}
    ops = {}
    if hasattr(fla_naive_module, "naive_recurrent_gla"):
        ops["fla_naive_recurrent"] = lambda q, k, v, g: fla_naive_module.naive_recurrent_gla(q, k, v, g)[0]
    if hasattr(fla_naive_module, "naive_chunk_gla"):
        ops["fla_naive_chunk"] = lambda q, k, v, g: fla_naive_module.naive_chunk_gla(q, k, v, g)[0]
    return ops


def build_ops(before_rev: str | None, compiled: bool = True) -> dict:
    ops = {"gla_chunk": lambda q, k, v, g: gla_chunk(q, k, v, g, chunk_size=CHUNK)[0]}
    if before_rev:
        before = load_before(before_rev)
        ops[f"gla_chunk@{before_rev}"] = lambda q, k, v, g: before(q, k, v, g, chunk_size=CHUNK)[0]
    if compiled:
        compiled_chunk = compile_fn(gla_chunk, "inductor", fullgraph=True, dynamic=False)
        ops["gla_chunk compiled"] = lambda q, k, v, g: compiled_chunk(q, k, v, g, chunk_size=CHUNK)[0]
    ops["gla_recurrent"] = lambda q, k, v, g: gla_recurrent(q, k, v, g)[0]
    ops.update(fla_naive())
    # softmax attention: SDPA wants [B, H, T, D]
    ops["sdpa_causal"] = lambda q, k, v, g: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    return ops


def floor_flops(time_steps: int, mode: str) -> float:
    forward = 2 * BATCH * time_steps * HEADS * (CHUNK * KEY_DIM + CHUNK * VALUE_DIM + 2 * KEY_DIM * VALUE_DIM)
    return forward * (1 if mode == "fwd" else 3)


def time_once(call, inputs, mode: str) -> float:
    start = time.perf_counter()
    if mode == "fwd":
        with torch.no_grad():
            call(*inputs)
    else:
        for x in inputs:
            x.grad = None
        call(*inputs).sum().backward()
    return time.perf_counter() - start


def saved_bytes(call, inputs) -> int:
    """Bytes autograd keeps between forward and backward (unique storages of saved tensors, inputs excluded)."""
    storages = {}
    input_ptrs = {x.untyped_storage().data_ptr() for x in inputs}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in input_ptrs:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = call(*inputs)
    del out
    return sum(storages.values())


def run(lengths: list[int], rounds: int, before_rev: str | None, compiled: bool = True) -> dict:
    started = time.perf_counter()
    load_start = os.getloadavg()
    ops = build_ops(before_rev, compiled)
    rows, compile_s, rates, loads = [], {}, [], []
    for mode in ("fwd", "fwd+bwd"):
        for time_steps in lengths:
            limits = {**MAX_T, **{(name, m): t for name in ops if "@" in name for m, t in BEFORE_MAX_T.items()}}
            active = {name: call for name, call in ops.items() if time_steps <= limits.get((name, mode), max(lengths))}
            inputs = make_inputs(time_steps)
            if mode == "fwd+bwd":
                inputs = [x.clone().requires_grad_() for x in inputs]
            for name, call in active.items():  # warm-up (and the compile, timed)
                seconds = time_once(call, inputs, mode)
                if name == "gla_chunk compiled":
                    compile_s[f"{mode} T={time_steps}"] = seconds
            times = {name: [] for name in active}
            n_rounds = rounds if time_steps <= 4096 else max(2, rounds // 2)
            for round_index in range(n_rounds):
                rates.append(measure_peak_flops("cpu", n=512, repeats=3))
                loads.append(os.getloadavg()[0])
                # A new order every round: the op timed right after SDPA (whose 4K score matrix evicts
                # the caches) reads its inputs from memory, the next one finds them in L3; a fixed order
                # would favour the same op every round (12% on a 4K forward at 1 thread).
                order = list(active.items())
                random.Random(round_index).shuffle(order)
                for name, call in order:
                    if name in SLOW_OPS and round_index >= 2:
                        continue  # two runs of a step loop are enough: it is 10-100x slower and steady
                    times[name].append(time_once(call, inputs, mode))
            for name, samples in times.items():
                best = min(samples)
                rows.append({
                    "op": name, "mode": mode, "T": time_steps, "best_s": best, "median_s": statistics.median(samples),
                    "runs": len(samples), "tokens_per_s": BATCH * time_steps / best,
                })
                print(f"  {name:24s} {mode:8s} T={time_steps:6d}  {rows[-1]['tokens_per_s']:12.0f} tokens/s", flush=True)

    rate = max(rates)
    for row in rows:
        row["floor_s"] = floor_flops(row["T"], row["mode"]) / rate
        row["pct_of_floor"] = 100 * row["floor_s"] / row["best_s"]

    def best_s(op, mode, time_steps):
        return next((r["best_s"] for r in rows if r["op"] == op and r["mode"] == mode and r["T"] == time_steps), None)

    def recurrent_s(mode, time_steps):  # the step loop's time at T, from its tokens/s at the longest T timed (flat in T)
        longest_row = max((r for r in rows if r["op"] == "gla_recurrent" and r["mode"] == mode), key=lambda r: r["T"])
        return longest_row["best_s"] * time_steps / longest_row["T"]

    targets = {}
    if 4096 in lengths and any(r["op"] == "gla_recurrent" for r in rows):
        chunk_fwd, rec_fwd = best_s("gla_chunk", "fwd", 4096), recurrent_s("fwd", 4096)
        chunk_fb, rec_fb = best_s("gla_chunk", "fwd+bwd", 4096), recurrent_s("fwd+bwd", 4096)
        floor = floor_flops(4096, "fwd") / rate
        targets = {
            "fwd_T4096_speedup_vs_recurrent": rec_fwd / chunk_fwd, "fwd_T4096_speedup_target": 15,
            "fwd_T4096_times_floor": chunk_fwd / floor, "fwd_T4096_times_floor_target": 4,
            "fwdbwd_T4096_speedup_vs_recurrent": rec_fb / chunk_fb, "fwdbwd_T4096_speedup_target": 8,
        }
        if before_rev:
            targets["fwd_T4096_speedup_vs_before"] = best_s(f"gla_chunk@{before_rev}", "fwd", 4096) / chunk_fwd
            targets["fwdbwd_T4096_speedup_vs_before"] = best_s(f"gla_chunk@{before_rev}", "fwd+bwd", 4096) / chunk_fb

    # Memory kept for the backward at the longest length, and accuracy next to speed at 1K tokens.
    longest = max(lengths)
    inputs = [x.clone().requires_grad_() for x in make_inputs(longest)]
    memory = {name: saved_bytes(ops[name], inputs) for name in ops if name.startswith("gla_chunk") and "compiled" not in name}
    q, k, v, g = make_inputs(1024)
    reference, _ = gla_recurrent(*(x.double() for x in (q, k, v, g)))
    accuracy = {name: rel_error(ops[name](q, k, v, g), reference) for name in ops if name != "sdpa_causal"}

    return {
        "config": {
            "batch": BATCH, "heads": HEADS, "key_dim": KEY_DIM, "value_dim": VALUE_DIM, "dtype": "float32", "chunk_size": CHUNK,
            "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__, "lengths": lengths,
            "rounds": rounds, "before": before_rev, "compiled": compiled, "fla_installed": bool(fla_naive()),
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "loadavg_1min_per_round": loads,
            "cores": os.cpu_count(),
        },
        "matmul_rate_flops": rate,
        "matmul_rate_flops_median": statistics.median(rates),
        "rows": rows,
        "targets_T4096": targets,
        "compile_s": compile_s,
        "saved_for_backward_bytes": {"T": longest, **memory},
        "rel_error_vs_float64_reference_T1024": accuracy,
        "notes": [
            "best of interleaved rounds; the machine is shared (load average per round in config).",
            "gla_recurrent / fla naive recurrent: two timed runs each, up to the MAX_T lengths (tokens/s flat in T); "
            "the T=4096 speedups over gla_recurrent scale its time at the longest T timed to 4096 tokens.",
            "compiled: inductor, static shapes, compile time (first call) in compile_s; compiled up to T=4096 only.",
            "floor: forward 2 T H (C K + C V + 2 K V) FLOPs, forward+backward 3x that, at matmul_rate_flops.",
        ],
        "total_s": time.perf_counter() - started,
    }


def draw(result: dict, path: Path) -> None:
    fig, axes = new_figure(ncols=2, size=(6.0, 4.5))
    rows = result["rows"]
    for ax, mode in zip(axes[0], ("fwd", "fwd+bwd")):
        for op in dict.fromkeys(r["op"] for r in rows):
            points = sorted((r["T"], r["tokens_per_s"]) for r in rows if r["op"] == op and r["mode"] == mode)
            if points:
                ax.plot(*zip(*points), marker="o", label=op)
        floor = sorted({(r["T"], r["T"] * BATCH / r["floor_s"]) for r in rows if r["mode"] == mode})
        ax.plot(*zip(*floor), "k:", label="matmul floor (C=64)")
        ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="tokens/s",
               title=f"GLA {mode} (CPU fp32, {result['config']['threads']} threads)")
        ax.legend(fontsize=6, loc="lower left")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated sequence lengths")
    parser.add_argument("--out", default=str(RESULTS), help="folder for gla_kernel.json and gla_kernel.png")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (half past 4K tokens)")
    parser.add_argument("--no-compile", dest="compiled", action="store_false",
                        help="leave out the inductor rows (each compile takes minutes on a loaded machine)")
    parser.add_argument("--before", default="2e46294", help="git revision whose gla_chunk is timed as 'before' ('' for none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    result = run(lengths, args.rounds, args.before or None, args.compiled)
    out = Path(args.out)
    atomic_write_json(out / "gla_kernel.json", result)
    draw(result, out / "gla_kernel.png")
    table = [
        {"op": r["op"], "mode": r["mode"], "T": r["T"], "tokens/s": f"{r['tokens_per_s']:,.0f}",
         "best ms": f"{1000 * r['best_s']:.1f}", "% floor": f"{r['pct_of_floor']:.1f}"}
        for r in result["rows"]
    ]
    print_table(table, list(table[0].keys()), title="GLA on CPU (B=1, H=4, K=V=64, fp32)")
    for name, value in result["targets_T4096"].items():
        print(f"{name}: {value:.2f}")
    print(f"saved for backward at T={result['saved_for_backward_bytes']['T']}: "
          f"{ {k: f'{v / 2**20:.1f} MiB' for k, v in result['saved_for_backward_bytes'].items() if k != 'T'} }")
    print(f"rel. error vs float64 reference at T=1024: { {c: f'{e:.1e}' for c, e in result['rel_error_vs_float64_reference_T1024'].items()} }")
    print(f"wrote {out / 'gla_kernel.json'} and {out / 'gla_kernel.png'} in {result['total_s']:.0f} s (load {result['config']['loadavg_end']})")


if __name__ == "__main__":
    sys.exit(main())
