"""gla_chunk over gate strength: forward and forward+backward at 4K tokens, float32 and bfloat16, each gate
strength's time against the weak gate's (issue 30: within 1.5x for every strength, no cliff).

    python bench/gla_gates.py [--threads 2] [--rounds 7] [--before REV]
        -> bench/results/gla_gates.json, bench/results/gla_gates.png, a table

Gates (per step, per key channel), x ~ N(0, 1):
  /16   logsigmoid(x) / 16   fla's default normaliser, the model's gate (what the other benches use)
  /4    logsigmoid(x) / 4
  1x    logsigmoid(x)        no normaliser: about -0.8 per step, -5 at the low end
  4x    4 logsigmoid(x)
  wipe  -1000 u, u ~ U(0, 1) every step wipes the state (decay e^-500 on average)
Width as bench/gla_bench.py: B=1, H=4, K=V=64, chunk 64. Interleaved rounds (every round times each case
once, in a new random order), medians and minima, the load average per round. --before REV also times
gla_chunk as of that git revision (bench/gla_revision.py) on every case: the cliff this removed.
Accuracy: relative error against the float64 step-by-step reference at 512 tokens, per gate and dtype.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from assay.core.files import atomic_write_json
from assay.core.metrics import new_figure, save_figure
from assay.core.numerics import rel_error, tolerance
from assay.core.output import print_table
from assay.ops import gla_chunk, gla_recurrent
from gla_revision import load_gla_chunk

RESULTS = Path(__file__).resolve().parent / "results"
BATCH, HEADS, KEY_DIM, VALUE_DIM, CHUNK = 1, 4, 64, 64, 64
GATES = ("/16", "/4", "1x", "4x", "wipe")
WEAK = "/16"
TARGET_RATIO = 1.5


def gate(name: str, shape, generator: torch.Generator) -> torch.Tensor:
    if name == "wipe":
        return -1000.0 * torch.rand(*shape, generator=generator)
    scale = {"/16": 1 / 16, "/4": 1 / 4, "1x": 1.0, "4x": 4.0}[name]
    return F.logsigmoid(torch.randn(*shape, generator=generator)) * scale


def make_inputs(time_steps: int, gate_name: str, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (BATCH, time_steps, HEADS, KEY_DIM)
    q, k = torch.randn(*shape, generator=generator), torch.randn(*shape, generator=generator)
    v = torch.randn(BATCH, time_steps, HEADS, VALUE_DIM, generator=generator)
    return [x.to(dtype) for x in (q, k, v, gate(gate_name, shape, generator))]


def call(fn, inputs, mode: str) -> None:
    if mode == "fwd":
        with torch.no_grad():
            fn(*inputs, chunk_size=CHUNK)
    else:
        for x in inputs:
            x.grad = None
        fn(*inputs, chunk_size=CHUNK)[0].float().sum().backward()


def accuracy(gate_name: str, dtype: torch.dtype) -> float:
    q, k, v, g = make_inputs(512, gate_name, dtype, seed=1)
    reference, _ = gla_recurrent(*(x.double() for x in (q, k, v, g)))
    return rel_error(gla_chunk(q, k, v, g, chunk_size=CHUNK)[0], reference)


def run(time_steps: int, rounds: int, before: str | None, dtypes: tuple[torch.dtype, ...]) -> dict:
    started, load_start = time.perf_counter(), os.getloadavg()
    versions = {"now": gla_chunk} | ({f"@{before}": load_gla_chunk(before)} if before else {})
    cases = [(version, gate_name, dtype, mode) for version in versions for gate_name in GATES for dtype in dtypes for mode in ("fwd", "fwd+bwd")]
    inputs = {}
    for gate_name in GATES:
        for dtype in dtypes:
            plain = make_inputs(time_steps, gate_name, dtype)
            inputs[(gate_name, dtype, "fwd")] = plain
            inputs[(gate_name, dtype, "fwd+bwd")] = [x.clone().requires_grad_() for x in plain]
    for version, gate_name, dtype, mode in cases:  # warm-up
        call(versions[version], inputs[(gate_name, dtype, mode)], mode)
    times = {case: [] for case in cases}
    loads = []
    for round_index in range(rounds):
        loads.append(os.getloadavg()[0])
        order = cases[:]
        random.Random(round_index).shuffle(order)
        for case in order:
            version, gate_name, dtype, mode = case
            if version != "now" and round_index >= 2:
                continue  # the old revision's strong gates take seconds: two rounds show the cliff
            start = time.perf_counter()
            call(versions[version], inputs[(gate_name, dtype, mode)], mode)
            times[case].append(time.perf_counter() - start)
    rows = []
    for (version, gate_name, dtype, mode), samples in times.items():
        rows.append({"version": version, "gate": gate_name, "dtype": str(dtype).removeprefix("torch."), "mode": mode, "T": time_steps,
                     "min_s": min(samples), "median_s": statistics.median(samples), "runs": len(samples)})
    for row in rows:
        weak = next(r for r in rows if r["version"] == row["version"] and r["gate"] == WEAK and r["dtype"] == row["dtype"] and r["mode"] == row["mode"])
        row["median_vs_weak"] = row["median_s"] / weak["median_s"]
        row["min_vs_weak"] = row["min_s"] / weak["min_s"]
    targets = {}
    for dtype in dtypes:
        for mode in ("fwd", "fwd+bwd"):
            mine = [r for r in rows if r["version"] == "now" and r["dtype"] == str(dtype).removeprefix("torch.") and r["mode"] == mode]
            worst = max(mine, key=lambda r: r["median_vs_weak"])
            best = max(mine, key=lambda r: r["min_vs_weak"])  # best-of-rounds: what a loaded machine resolves
            targets[f"{worst['dtype']} {mode}"] = {"worst_gate": worst["gate"], "median_vs_weak": worst["median_vs_weak"],
                                                   "worst_gate_by_min": best["gate"], "min_vs_weak": best["min_vs_weak"], "target": TARGET_RATIO,
                                                   "met": worst["median_vs_weak"] <= TARGET_RATIO, "met_by_min": best["min_vs_weak"] <= TARGET_RATIO,
                                                   "missed_by_min": [r["gate"] for r in mine if r["min_vs_weak"] > TARGET_RATIO]}
    errors = {f"{g} {str(d).removeprefix('torch.')}": accuracy(g, d) for g in GATES for d in dtypes}
    return {
        "config": {"batch": BATCH, "heads": HEADS, "key_dim": KEY_DIM, "value_dim": VALUE_DIM, "chunk_size": CHUNK, "T": time_steps,
                   "rounds": rounds, "before": before, "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "cores": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "loadavg_1min_per_round": loads},
        "rows": rows,
        "targets": targets,
        "rel_error_vs_float64_T512": errors,
        "tolerance": {str(d).removeprefix("torch."): tolerance("recurrence", d) for d in dtypes},
        "notes": ["median_vs_weak: a case's median time over the /16 gate's, same version, dtype and mode; min_vs_weak: the same for the best round",
                  "targets: met by median and met_by_min (best of rounds); on a loaded 2-core machine at 2 threads the medians carry scheduling waits",
                  "the machine's load average per round is in config; compare ratios, not absolute times, across runs"],
        "total_s": time.perf_counter() - started,
    }


def draw(result: dict, path: Path) -> None:
    rows = [r for r in result["rows"] if r["version"] == "now"]
    groups = list(dict.fromkeys((r["dtype"], r["mode"]) for r in rows))
    fig, axes = new_figure(ncols=len(groups), size=(3.6, 3.8))
    for ax, (dtype, mode) in zip(axes[0], groups):
        mine = {r["gate"]: r for r in rows if r["dtype"] == dtype and r["mode"] == mode}
        ax.bar(range(len(GATES)), [1000 * mine[g]["median_s"] for g in GATES], color="tab:blue", label="gla_chunk (median)")
        ax.axhline(1000 * TARGET_RATIO * mine[WEAK]["median_s"], color="k", linestyle=":", label=f"{TARGET_RATIO}x the /16 gate")
        old = {r["gate"]: r for r in result["rows"] if r["version"] != "now" and r["dtype"] == dtype and r["mode"] == mode}
        if old:
            ax.plot(range(len(GATES)), [1000 * old[g]["median_s"] for g in GATES], "rx", label=next(iter(old.values()))["version"])
            ax.set_yscale("log")
        ax.set(xticks=range(len(GATES)), xticklabels=GATES, xlabel="gate", ylabel="ms", title=f"{mode}, {dtype}, T={result['config']['T']}")
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096, help="sequence length")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated input dtypes")
    parser.add_argument("--before", default=None, help="also time gla_chunk as of this git revision (two rounds)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for gla_gates.json and gla_gates.png")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = tuple(getattr(torch, name) for name in args.dtypes.split(","))
    result = run(args.T, args.rounds, args.before, dtypes)
    out = Path(args.out)
    atomic_write_json(out / "gla_gates.json", result)
    draw(result, out / "gla_gates.png")
    table = [{"version": r["version"], "gate": r["gate"], "dtype": r["dtype"], "mode": r["mode"], "median ms": f"{1000 * r['median_s']:.1f}",
              "min ms": f"{1000 * r['min_s']:.1f}", "x /16 (median)": f"{r['median_vs_weak']:.2f}",
              "x /16 (min)": f"{r['min_vs_weak']:.2f}"} for r in result["rows"]]
    print_table(table, list(table[0].keys()), title=f"gla_chunk by gate strength, T={args.T}, {args.threads} thread(s)")
    for name, target in result["targets"].items():
        print(f"{name}: by median worst {target['worst_gate']} {target['median_vs_weak']:.2f}x the /16 gate ({'met' if target['met'] else 'missed'}); "
              f"by best of rounds worst {target['worst_gate_by_min']} {target['min_vs_weak']:.2f}x ({'met' if target['met_by_min'] else 'missed'}, target {TARGET_RATIO}x)")
    print(f"rel. error vs float64 at T=512: { {k: f'{v:.1e}' for k, v in result['rel_error_vs_float64_T512'].items()} }")
    print(f"wrote {out / 'gla_gates.json'} in {result['total_s']:.0f} s (load {result['config']['loadavg_end']})")


if __name__ == "__main__":
    sys.exit(main())
