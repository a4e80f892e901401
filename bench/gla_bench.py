"""GLA on CPU: chunked form vs the step-by-step reference vs softmax attention, over sequence length.

    python bench/gla_bench.py            -> bench/results/gla.json, bench/results/gla.png, a table

Width B=1, H=4, K=V=64 in float32; softmax attention is torch SDPA (causal) of the same width.
Times are the best of a few steady runs after one warm-up run: on a shared machine the best run is
the one least disturbed by other processes (the median is recorded too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from assay.core.files import atomic_write_json
from assay.core.metrics import StepTimer, new_figure, save_figure
from assay.core.numerics import rel_error
from assay.core.output import print_table
from assay.ops import gla_chunk, gla_recurrent

RESULTS = Path(__file__).resolve().parent / "results"
BATCH, HEADS, KEY_DIM, VALUE_DIM = 1, 4, 64, 64
LENGTHS = [1024, 2048, 4096, 8192, 16384]
CHUNK_SIZES = [16, 32, 64, 128]
DEFAULT_CHUNK = 64
# The step loop's backward keeps all T states ([B, H, K, V] each) alive: past this length it only
# costs time and memory, and its tokens/s is flat in T anyway.
RECURRENT_MAX_T = {"fwd": max(LENGTHS), "fwd+bwd": 4096}
CHUNK_SIZE_LENGTHS = {"fwd": [4096, 16384], "fwd+bwd": [4096]}
# Linear scaling: tokens/s at the longest length within 20% of that at 2K.
SCALING_FLOOR = 0.8


def make_inputs(time_steps: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)
    k = torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)
    v = torch.randn(BATCH, time_steps, HEADS, VALUE_DIM, generator=generator)
    # GLA's usual gate: logsigmoid(x) / 16, a slow forget (the paper's normaliser).
    g = F.logsigmoid(torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)) / 16
    return q, k, v, g


def gla_call(op: str, chunk_size: int | None):
    if op == "gla_chunk":
        return lambda q, k, v, g: gla_chunk(q, k, v, g, chunk_size=chunk_size)[0]
    if op == "gla_recurrent":
        return lambda q, k, v, g: gla_recurrent(q, k, v, g)[0]
    # softmax attention: SDPA wants [B, H, T, D]
    return lambda q, k, v, g: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)


def measure(op: str, chunk_size: int | None, mode: str, time_steps: int, repeats: int) -> dict:
    inputs = make_inputs(time_steps)
    call = gla_call(op, chunk_size)
    if mode == "fwd+bwd":
        inputs = [x.clone().requires_grad_() for x in inputs]
    timer = StepTimer("cpu", warmup_steps=1)
    for _ in range(1 + repeats):
        if mode == "fwd+bwd":
            for x in inputs:
                x.grad = None
        timer.start()
        if mode == "fwd":
            with torch.no_grad():
                call(*inputs)
        else:
            call(*inputs).sum().backward()
        timer.stop()
    best = min(timer.steady)
    return {
        "op": op,
        "chunk_size": chunk_size,
        "mode": mode,
        "T": time_steps,
        "best_s": best,
        "median_s": statistics.median(timer.steady),
        "tokens_per_s": BATCH * time_steps / best,
    }


def repeats_for(time_steps: int) -> int:
    # More runs where they are cheap: the best of more runs is less disturbed by other processes.
    return 5 if time_steps <= 4096 else 3


def run(lengths: list[int]) -> dict:
    started = time.perf_counter()
    load_start = os.getloadavg()
    rows = []

    def record(row: dict) -> None:
        rows.append(row)
        label = f"{row['op']}" + (f"[{row['chunk_size']}]" if row["chunk_size"] else "")
        print(f"  {label:16s} {row['mode']:8s} T={row['T']:6d}  {row['tokens_per_s']:12.0f} tokens/s", flush=True)

    for mode in ("fwd", "fwd+bwd"):
        for time_steps in lengths:
            record(measure("gla_chunk", DEFAULT_CHUNK, mode, time_steps, repeats_for(time_steps)))
            record(measure("sdpa_causal", None, mode, time_steps, repeats_for(time_steps)))
            if time_steps <= RECURRENT_MAX_T[mode]:
                record(measure("gla_recurrent", None, mode, time_steps, 2))
        for time_steps in CHUNK_SIZE_LENGTHS[mode]:
            if time_steps not in lengths:
                continue
            for chunk_size in CHUNK_SIZES:
                if chunk_size != DEFAULT_CHUNK:
                    record(measure("gla_chunk", chunk_size, mode, time_steps, repeats_for(time_steps)))

    # Accuracy next to speed: each chunk size against the float64 reference at 1K tokens.
    q, k, v, g = make_inputs(1024)
    reference, _ = gla_recurrent(*(x.double() for x in (q, k, v, g)))
    accuracy = {str(c): rel_error(gla_chunk(q, k, v, g, chunk_size=c)[0], reference) for c in CHUNK_SIZES}

    def tokens_per_s(op, mode, time_steps, chunk_size=None):
        for row in rows:
            if row["op"] == op and row["mode"] == mode and row["T"] == time_steps and row["chunk_size"] == chunk_size:
                return row["tokens_per_s"]
        return None

    longest = max(lengths)
    scaling = {}
    if 2048 in lengths and longest > 2048:
        for op, chunk_size in (("gla_chunk", DEFAULT_CHUNK), ("sdpa_causal", None)):
            for mode in ("fwd", "fwd+bwd"):
                ratio = tokens_per_s(op, mode, longest, chunk_size) / tokens_per_s(op, mode, 2048, chunk_size)
                scaling[f"{op} {mode}"] = {"ratio_T{}_vs_2K".format(longest): ratio, "linear": ratio >= SCALING_FLOOR}
    crossover = {}
    for mode in ("fwd", "fwd+bwd"):
        faster = [t for t in lengths if tokens_per_s("gla_chunk", mode, t, DEFAULT_CHUNK) > tokens_per_s("sdpa_causal", mode, t)]
        crossover[mode] = min(faster) if faster else None

    return {
        "config": {
            "batch": BATCH, "heads": HEADS, "key_dim": KEY_DIM, "value_dim": VALUE_DIM, "dtype": "float32",
            "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "default_chunk_size": DEFAULT_CHUNK, "lengths": lengths,
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        },
        "rows": rows,
        "linear_scaling": scaling,
        "gla_faster_than_sdpa_from_T": crossover,
        "rel_error_vs_float64_reference_T1024": accuracy,
        "notes": [
            f"gla_recurrent fwd+bwd measured only up to T={RECURRENT_MAX_T['fwd+bwd']}: its backward keeps all T states; "
            "a step loop's tokens/s does not depend on T.",
            "tokens_per_s from the best of the steady runs (one warm-up run discarded); median_s recorded too.",
            "CPU shared with other processes: loadavg at start and end recorded in config; one torch thread by default "
            "(--threads), since a parallel region on a shared core waits for its slowest thread.",
        ],
        "total_s": time.perf_counter() - started,
    }


def draw(result: dict, path: Path) -> None:
    fig, axes = new_figure(ncols=2)
    ax_length, ax_chunk = axes[0]
    rows = result["rows"]
    styles = {"fwd": "-", "fwd+bwd": "--"}
    for op, chunk_size in (("gla_chunk", DEFAULT_CHUNK), ("gla_recurrent", None), ("sdpa_causal", None)):
        for mode in ("fwd", "fwd+bwd"):
            points = sorted((r["T"], r["tokens_per_s"]) for r in rows if r["op"] == op and r["mode"] == mode and r["chunk_size"] == chunk_size)
            if points:
                label = f"{op}{f' C={chunk_size}' if chunk_size else ''} {mode}"
                ax_length.plot(*zip(*points), styles[mode], marker="o", label=label)
    ax_length.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="tokens/s", title="GLA vs softmax attention (CPU, fp32)")
    ax_length.legend(fontsize=7, loc="lower left")
    for mode, lengths in CHUNK_SIZE_LENGTHS.items():
        for time_steps in lengths:
            points = sorted((r["chunk_size"], r["tokens_per_s"]) for r in rows if r["op"] == "gla_chunk" and r["mode"] == mode and r["T"] == time_steps)
            if points:
                ax_chunk.plot(*zip(*points), styles[mode], marker="o", label=f"{mode} T={time_steps}")
    ax_chunk.set(xscale="log", xlabel="chunk size", ylabel="tokens/s", title="gla_chunk: chunk size")
    ax_chunk.set_xticks(CHUNK_SIZES, [str(c) for c in CHUNK_SIZES])
    ax_chunk.minorticks_off()
    ax_chunk.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated sequence lengths")
    parser.add_argument("--out", default=str(RESULTS), help="folder for gla.json and gla.png")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    result = run(lengths)
    out = Path(args.out)
    atomic_write_json(out / "gla.json", result)
    draw(result, out / "gla.png")
    table = [
        {
            "op": r["op"] + (f" C={r['chunk_size']}" if r["chunk_size"] else ""),
            "mode": r["mode"],
            "T": r["T"],
            "tokens/s": f"{r['tokens_per_s']:,.0f}",
            "best ms": f"{1000 * r['best_s']:.1f}",
        }
        for r in result["rows"]
    ]
    print_table(table, ["op", "mode", "T", "tokens/s", "best ms"], title="GLA on CPU (B=1, H=4, K=V=64, fp32)")
    scaling = [{"op": name, **{k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in entry.items()}} for name, entry in result["linear_scaling"].items()]
    if scaling:
        print_table(scaling, list(scaling[0].keys()), title="tokens/s at the longest T over tokens/s at 2K (linear: >= 0.8)")
    print(f"gla_chunk faster than SDPA from T = {result['gla_faster_than_sdpa_from_T']}")
    print(f"rel. error vs float64 reference at T=1024: { {c: f'{e:.1e}' for c, e in result['rel_error_vs_float64_reference_T1024'].items()} }")
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"wrote {out / 'gla.json'} and {out / 'gla.png'} in {result['total_s']:.0f} s")


if __name__ == "__main__":
    main()
