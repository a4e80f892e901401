"""How fast this machine's matmul library runs a decode step's linears: the evidence behind the serving floors
(issue #29, Speed; bench/serve/speed.py).

    python bench/core/small_m_matmul.py [--threads 2] [--dtypes float32,bfloat16]
        -> bench/results/small_m_matmul.json, a table

serve_speed's floors take a decode step's FLOPs at the rate of one large square matmul, or its weight bytes
at the rate of one pass over a large tensor. A decode step is neither: it multiplies M = 1-32 rows by every
weight of the model once, and the weights (540 MB for SmolLM2-135M in float32) do not stay in cache between
steps. This bench runs exactly that: SmolLM2-135M-Instruct's 30 layers of q, k, v, o, gate, up, down
weights plus the tied output head, each a distinct tensor read once per pass (so from memory, as in
serving), `F.linear` at M rows, and MKL's packed-weight GEMM (`mkl._mkl_linear`, what inductor's freezing
uses) beside it. Reported per M: milliseconds per pass, GFLOP/s, the weights' GB/s, and both as shares of
the rates measured in the same run (core.metrics.measure_peak_flops; a sum over 256 MiB).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import time

import torch

from assay.core.files import atomic_write_json
from assay.core.metrics import measure_peak_flops
from assay.core.output import print_table
from bench.common import RESULTS, best_of, machine, read_rate  # the serving floors' read rate, measured the same way

DIM, HIDDEN, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152  # SmolLM2-135M: [out, in] weight shapes below
SHAPES = [(DIM, DIM), (KV, DIM), (KV, DIM), (DIM, DIM), (HIDDEN, DIM), (HIDDEN, DIM), (DIM, HIDDEN)]


def run(dtype: torch.dtype, rows: list[int], repeats: int, peak: float, read: float) -> list[dict]:
    weights = [torch.randn(n, k).to(dtype) for _ in range(LAYERS) for n, k in SHAPES] + [torch.randn(VOCAB, DIM).to(dtype)]
    params = sum(w.numel() for w in weights)
    out = []
    for m in rows:
        x = torch.randn(m, HIDDEN).to(dtype)

        def linear_pass():
            for w in weights:
                torch.nn.functional.linear(x[:, : w.shape[1]], w)

        seconds = {"linear": best_of(linear_pass, repeats)}
        if dtype == torch.float32 and torch.backends.mkl.is_available():
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]

            def packed_pass():
                for w, p in zip(weights, packed):
                    torch.ops.mkl._mkl_linear(x[:, : w.shape[1]], p, w, None, m)

            seconds["mkl_packed"] = best_of(packed_pass, repeats)
            del packed
        for kind, s in seconds.items():
            flops, nbytes = 2 * m * params, params * weights[0].element_size()
            out.append({"dtype": str(dtype).removeprefix("torch."), "rows": m, "kind": kind, "ms": s * 1e3,
                        "gflops": flops / s / 1e9, "of_matmul_rate": flops / s / peak, "weights_gb_s": nbytes / s / 1e9,
                        "of_read_rate": nbytes / s / read})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", default="1,8,32,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "small_m_matmul.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    read = read_rate()
    results, rates = [], {"read_bytes_per_s": read, "matmul_flops": {}}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        peak = measure_peak_flops("cpu", dtype, n=1024, repeats=5)
        rates["matmul_flops"][name] = peak
        results += run(dtype, rows, args.repeats, peak, read)
    atomic_write_json(args.out, {"threads": args.threads, "machine": machine(), "rates": rates, "rows": results, "torch": torch.__version__,
                                 "model": "SmolLM2-135M linears + tied head, random weights, each read once per pass"})
    print_table(results, ["dtype", "rows", "kind", "ms", "gflops", "of_matmul_rate", "weights_gb_s", "of_read_rate"],
                title=f"decode linears, {args.threads} threads (read {read / 1e9:.1f} GB/s; matmul "
                      + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates["matmul_flops"].items()) + " GFLOP/s)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
