"""The compiled decode step with each GEMM (serve/runner/gemm.py), width by width, on the real
SmolLM2-135M-Instruct, against the floor this run's machine sets: the evidence behind `--decode-gemm auto`.

    python bench/serve/decode_gemm.py --model smollm2/ [--widths 1,2,4,8,16,32] [--gemms aten,cpp] [--threads 2] [--profile]
        [--dtype float32|bfloat16] [--quantize int8] [--out FILE]
        -> bench/results/decode_gemm.json, bench/results/decode_gemm.png, a table

Each GEMM gets its own compiled decode (its own graphs, a fresh inductor cache folder, so every compile is
timed cold), compiled at every width first; then the steps are timed in rounds that visit every (GEMM,
width) once each, so a change in the machine's load hits all alike (median of the rounds' best-of-3).
Every step is also run by the eager model on the same inputs: the largest relative difference of the
logits is in the JSON (float32: reassociation only).

--quantize int8 runs the model with its linears in int8 (serve/runner/quantize.py), as `assay serve --quantize
int8` does; its eager check is against the eager int8 model.

The floor of a step: the weights' bytes (every matmul weight and the output head, read once) plus the
KV cache the compiled step reads (W rows x max_len positions, keys and values, every layer), at the
read rate measured in this run. `of_floor` 1.0 is a step at the memory's rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import statistics
import tempfile
import time

import torch

from assay.core.files import atomic_write_json
from assay.serve.runner.dtypes import QUANTIZATIONS
from assay.core.output import print_table
from bench.common import RESULTS, best_of, machine, read_rate, top_ops

POSITION = 100  # each row's token position: a 128-token prompt's decode, well inside max_len


def _plot(rows: list[dict], path: Path, dtype: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for gemm in sorted({row["gemm"] for row in rows}):
        mine = [row for row in rows if row["gemm"] == gemm]
        axis.plot([row["width"] for row in mine], [row["ms"] for row in mine], marker="o", label=f"{gemm} GEMM")
    floor = sorted({(row["width"], row["floor_ms"]) for row in rows})
    axis.plot([w for w, _ in floor], [f for _, f in floor], linestyle="--", color="gray", label="floor (read rate)")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("decode width (rows)")
    axis.set_ylabel("ms per compiled decode step")
    axis.set_title(f"SmolLM2-135M compiled decode step, {dtype} weights")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the real model folder (assay zoo real smollm2/)")
    parser.add_argument("--widths", default="1,2,4,8,16,32")
    parser.add_argument("--gemms", default="aten,cpp")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--max-len", type=int, default=256, help="positions per slot (the compiled step reads all of them)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32", help="the weights' dtype (the KV cache and the logits stay float32)")
    parser.add_argument("--quantize", default=None, choices=QUANTIZATIONS, help="int8: the linears' weights in int8 (as assay serve --quantize int8)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler's top ops over 10 calls of each step auto chooses, in its row")
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_gemm.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    gemms = args.gemms.split(",")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="decode-gemm-")  # cold compiles, timed

    from assay.models.slots import kv_bytes
    from assay.serve.runner.compiled_decode import CompiledDecode
    from assay.serve.runner.quantize import quantize_slot_model
    from assay.serve.runner.weights import load_slot_model, matmul_weight_bytes

    slot_model = load_slot_model(args.model, torch.device("cpu"), args.max_len, args.dtype)
    if args.quantize:
        quantize_slot_model(slot_model, args.quantize, torch.device("cpu"))
    buffers = slot_model.pool_buffers(max(widths), torch.float32, args.max_len)
    weight_bytes = matmul_weight_bytes(slot_model.model)
    read = read_rate()  # again after the compiles: the faster of the two (a compile beside it slows the first)
    print(f"read rate {read / 1e9:.1f} GB/s; matmul weights + head {weight_bytes / 1e6:.0f} MB", flush=True)

    decoders = {gemm: CompiledDecode(slot_model, "inductor", max(widths), torch.device("cpu"), gemm) for gemm in gemms}
    inputs = {w: (torch.randint(0, 1000, (w, 1), generator=torch.Generator().manual_seed(w)), torch.arange(w),
                  torch.full((w,), POSITION)) for w in widths}
    compile_s, errors = {}, {}
    with torch.no_grad():
        for gemm, decoder in decoders.items():
            for width in widths:
                print(f"compiling width {width} with the {gemm} GEMM ...", flush=True)
                start = time.perf_counter()
                logits = decoder(*inputs[width], buffers)
                compile_s[gemm, width] = time.perf_counter() - start
                reference = slot_model.decode(*inputs[width], buffers)
                errors[gemm, width] = float((logits - reference).abs().max() / reference.abs().max())
        read = max(read, read_rate())
        samples = {key: [] for key in compile_s}
        for round_ in range(args.rounds):
            for key in samples:
                gemm, width = key
                samples[key].append(best_of(lambda: decoders[gemm](*inputs[width], buffers), 3))
            print(f"round {round_ + 1}/{args.rounds}", flush=True)
    rows = []
    for (gemm, width), seconds in samples.items():
        kv = width * kv_bytes(slot_model.args, args.max_len, torch.float32)
        floor = (weight_bytes + kv) / read
        ms = statistics.median(seconds) * 1e3
        rows.append({"gemm": gemm, "width": width, "ms": ms, "floor_ms": floor * 1e3, "of_floor": floor * 1e3 / ms,
                     "tokens_per_s": width / ms * 1e3, "compile_s": compile_s[gemm, width], "max_rel_err": errors[gemm, width],
                     "chosen_by_auto": decoders[gemm].gemms[width] == _auto(width, decoders[gemm].weights_dtype)})
    rows.sort(key=lambda row: (row["width"], row["gemm"]))
    if args.profile:  # where a step's time goes outside its compiled graph (attention's kernel, dynamo's guards, the graph's call)
        with torch.no_grad():
            for row in rows:
                if row["chosen_by_auto"]:
                    decoder, step_inputs = decoders[row["gemm"]], inputs[row["width"]]
                    row["profile_top_ops"] = top_ops(lambda: [decoder(*step_inputs, buffers) for _ in range(10)])
    cpu = {"capability": torch.backends.cpu.get_cpu_capability(), "amx": torch.cpu._is_amx_tile_supported()}
    atomic_write_json(args.out, {"threads": args.threads, "dtype": args.dtype, "quantize": args.quantize, "machine": machine(), "cpu_kernels": cpu, "read_bytes_per_s": read,
                                 "weight_bytes": weight_bytes, "max_len": args.max_len, "position": POSITION, "torch": torch.__version__,
                                 "model": str(args.model), "rows": rows})
    weights = f"{args.dtype}, linears in {args.quantize}" if args.quantize else args.dtype
    _plot(rows, args.out.with_suffix(".png"), weights)
    print_table(rows, ["width", "gemm", "ms", "floor_ms", "of_floor", "tokens_per_s", "compile_s", "max_rel_err"],
                title=f"compiled decode step, SmolLM2-135M {weights}, {args.threads} threads (read {read / 1e9:.1f} GB/s)")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _auto(width: int, dtype: str) -> str:
    from assay.serve.runner.gemm import decode_gemm

    return decode_gemm("auto", "cpu", "inductor", width, dtype)


if __name__ == "__main__":
    main()
