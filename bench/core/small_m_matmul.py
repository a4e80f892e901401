"""How fast this machine's matmul libraries run a decode step's linears, candidate by candidate, against the
machine's floors: the evidence behind the serving floors (bench/serve/speed.py) and the kernel choice.

    python bench/core/small_m_matmul.py [--threads 2] [--dtypes float32,bfloat16] [--rows 1,8,32]
        -> bench/results/small_m_matmul.json, a table

A decode step multiplies M = 1-32 rows by every weight of the model once, and the weights (540 MB for
SmolLM2-135M in float32) do not stay in cache between steps. This bench runs exactly that:
SmolLM2-135M-Instruct's 30 layers of q, k, v, o, gate, up, down weights plus the tied output head, each a
distinct tensor read once per pass (so from memory, as in serving), through each candidate:

- `linear`: `F.linear`, what eager decode runs (MKL for float32, oneDNN for bfloat16 on x86);
- `mkl_packed` (float32): MKL's packed-weight GEMM (`mkl._mkl_linear`), what inductor's freezing uses;
- `onednn_packed`: oneDNN's packed linear (`mkldnn._linear_pointwise` on `mkldnn._reorder_linear_weight`);
- `inductor_cpp_gemm`: inductor with freezing and max-autotune on the C++ GEMM template backend
  (`max_autotune_gemm_backends="CPP"`), which generates small-M micro-kernels for the run's CPU;
- AMX bfloat16 kernels where the CPU has AMX tiles (oneDNN and the C++ template pick them by themselves;
  `amx` in the JSON says whether this CPU has them).

Reported per candidate and M: milliseconds per pass, GFLOP/s, the weights' GB/s, and both as shares of the
rates measured in the same run (core.metrics.measure_peak_flops; a sum over 256 MiB); `of_read_rate` 1.0 is
the floor (every weight byte read once at the memory's rate), and the compile seconds of the inductor candidate.
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


def run(dtype: torch.dtype, rows: list[int], repeats: int, peak: float, read: float, layers: int, inductor: bool) -> list[dict]:
    weights = [torch.randn(n, k).to(dtype) for _ in range(layers) for n, k in SHAPES] + [torch.randn(VOCAB, DIM).to(dtype)]
    params = sum(w.numel() for w in weights)
    out = []
    for m in rows:
        x = torch.randn(m, HIDDEN).to(dtype)
        seconds, compile_s = {}, None

        def linear_pass():
            for w in weights:
                torch.nn.functional.linear(x[:, : w.shape[1]], w)

        seconds["linear"] = best_of(linear_pass, repeats)
        if dtype == torch.float32 and torch.backends.mkl.is_available():
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]

            def mkl_pass():
                for w, p in zip(weights, packed):
                    torch.ops.mkl._mkl_linear(x[:, : w.shape[1]], p, w, None, m)

            seconds["mkl_packed"] = best_of(mkl_pass, repeats)
            del packed
        if torch.backends.mkldnn.is_available():
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in weights]

            def onednn_pass():
                for w, p in zip(weights, packed):
                    torch.ops.mkldnn._linear_pointwise(x[:, : w.shape[1]], p, None, "none", [None], "")

            seconds["onednn_packed"] = best_of(onednn_pass, repeats)
            del packed
        errors = {}
        if inductor:
            compiled, compile_s = compile_cpp_gemm(weights, x)
            seconds["inductor_cpp_gemm"] = best_of(lambda: compiled(x), repeats)
            errors["inductor_cpp_gemm"] = max_relative_error(compiled(x), weights, x)
            del compiled
        for kind, s in seconds.items():
            flops, nbytes = 2 * m * params, params * weights[0].element_size()
            out.append({"dtype": str(dtype).removeprefix("torch."), "rows": m, "kind": kind, "ms": s * 1e3,
                        "gflops": flops / s / 1e9, "of_matmul_rate": flops / s / peak, "weights_gb_s": nbytes / s / 1e9,
                        "of_read_rate": nbytes / s / read, "compile_s": compile_s if kind == "inductor_cpp_gemm" else None,
                        "max_rel_err": errors.get(kind)})
            print(f"{out[-1]['dtype']} M={m} {kind}: {s * 1e3:.1f} ms, {out[-1]['of_read_rate']:.2f} of the read rate", flush=True)
    return out


def max_relative_error(outputs: list[torch.Tensor], weights: list[torch.Tensor], x: torch.Tensor) -> float:
    """The largest |out - ref| / max |ref| over the pass's outputs, the reference computed in float64: a kernel
    that is fast because it skips work shows here."""
    worst = 0.0
    for out, w in zip(outputs, weights):
        ref = x[:, : w.shape[1]].double() @ w.double().T
        worst = max(worst, float((out.double() - ref).abs().max() / ref.abs().max()))
    return worst


class Linears(torch.nn.Module):
    """The pass as a module, its weights parameters: inductor's freezing folds them in as constants."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(w, requires_grad=False) for w in weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [torch.nn.functional.linear(x[:, : w.shape[1]], w) for w in self.weights]


def compile_cpp_gemm(weights: list[torch.Tensor], x: torch.Tensor):
    """The pass compiled by inductor with freezing and max-autotune over the C++ GEMM template (aten's GEMM
    offered beside it, so each shape keeps the faster); (a callable, its compile seconds)."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    module = Linears(weights).eval()
    with inductor_config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN", force_disable_caches=True):
        compiled = torch.compile(module, backend="inductor", mode="max-autotune-no-cudagraphs")
        start = time.perf_counter()
        with torch.no_grad():
            compiled(x)
        compile_s = time.perf_counter() - start

    def call(x):
        with torch.no_grad():
            return compiled(x)

    return call, compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=LAYERS, help="decoder layers' weights per pass (SmolLM2-135M: 30)")
    parser.add_argument("--no-inductor", action="store_true", help="leave out the inductor candidate (minutes of compiling)")
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
        results += run(dtype, rows, args.repeats, peak, read, args.layers, not args.no_inductor)
    cpu = {"capability": torch.backends.cpu.get_cpu_capability(), "amx": torch.cpu._is_amx_tile_supported(),
           "avx512_bf16": torch.cpu._is_avx512_bf16_supported()}
    atomic_write_json(args.out, {"threads": args.threads, "machine": machine(), "cpu_kernels": cpu, "rates": rates, "rows": results,
                                 "torch": torch.__version__, "layers": args.layers,
                                 "model": "SmolLM2-135M linears + tied head, random weights, each read once per pass"})
    print_table(results, ["dtype", "rows", "kind", "ms", "gflops", "of_matmul_rate", "weights_gb_s", "of_read_rate", "compile_s", "max_rel_err"],
                title=f"decode linears, {args.threads} threads (read {read / 1e9:.1f} GB/s; matmul "
                      + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates["matmul_flops"].items()) + " GFLOP/s)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
