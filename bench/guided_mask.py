"""What a grammar costs per decode step on the real SmolLM2-135M-Instruct (vocabulary 49,152), with llguidance:
compile time (first and cached), mask fill per row and for a batch, applying masks to logits, and how much of
the fill hides behind the model's forward when it runs on the worker thread (TokenMasks.start_fill).

    python bench/guided_mask.py [--model DIR] [--steps 40] [--widths 1,8]
        -> bench/results/guided_mask.json (with os.getloadavg() at the start and end: figures on a shared
           machine are noisy)

CPU time (time.process_time, every thread of the process) is kept beside wall time for the fill and the
apply: on a loaded machine a millisecond-long operation is often preempted, and its wall time says little.

A step is timed three ways at each width, every row under the same nested JSON schema, the matchers walking
a fixed valid JSON text token by token (so every width sees the same grammar states):
  forward     the model's forward alone (one new token per row, KV cache)
  serial      fill, then forward, then apply
  overlapped  start_fill, forward, result(), apply
overlap = (serial - overlapped) / fill: 1.0 means the fill cost nothing beside the forward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assay.core.files import atomic_write_json
from assay.serve.guided import GrammarCompiler, TokenMasks

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "role", "tags", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"], "properties": {
            "city": {"type": "string"}, "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            "geo": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}}}},
    },
}
TEXT = json.dumps({"name": "Ada Lovelace of the Analytical Engine", "age": 36, "role": "admin",
                   "tags": ["math", "poetry", "engines"], "address": {"city": "London", "zip": 12345, "geo": {"lat": 51.5, "lon": -0.12}}})


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def compile_times(tokenizer, stop: int) -> dict:
    start = time.perf_counter()
    compiler = GrammarCompiler(tokenizer, [stop])
    setup = time.perf_counter() - start
    start = time.perf_counter()
    compiler.json_schema(SCHEMA, strict=True)
    first = time.perf_counter() - start
    start = time.perf_counter()
    compiler.json_schema(SCHEMA, strict=True)
    second = time.perf_counter() - start
    return {"tokenizer_setup_ms": round(setup * 1e3, 2), "first_compile_ms": round(first * 1e3, 3),
            "cached_compile_ms": round(second * 1e3, 4), "compiles": compiler.compiles, "hits": compiler.hits}


def width_run(model, tokenizer, compiler: GrammarCompiler, width: int, steps: int) -> dict:
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)[:steps]
    grammar = compiler.json_schema(SCHEMA, strict=True)
    masks = TokenMasks(compiler.vocab_size, rows=width)
    timings: dict[str, list[float]] = {"fill": [], "apply": [], "forward": [], "serial": [], "overlapped": [],
                                       "fill_cpu": [], "apply_cpu": []}
    with torch.inference_mode():
        prompt = torch.tensor([tokenizer.encode("A person as JSON:", add_special_tokens=False)] * width)
        for mode in ("serial", "overlapped"):
            matchers = {row: grammar.matcher() for row in range(width)}
            cache = model(input_ids=prompt, use_cache=True).past_key_values
            for token in tokens:
                inputs = torch.full((width, 1), token)
                start = time.perf_counter()
                if mode == "serial":
                    cpu = time.process_time()
                    rows = masks.fill(matchers)
                    timings["fill_cpu"].append(time.process_time() - cpu)
                    filled = time.perf_counter()
                    out = model(input_ids=inputs, cache=cache, use_cache=True)
                    forwarded = time.perf_counter()
                    timings["fill"].append(filled - start)
                    timings["forward"].append(forwarded - filled)
                else:
                    pending = masks.start_fill(matchers)
                    out = model(input_ids=inputs, cache=cache, use_cache=True)
                    rows = pending.result()
                cache, logits = out.past_key_values, out.logits[:, -1, :].float()
                applying, cpu = time.perf_counter(), time.process_time()
                masks.apply(logits, rows)
                end = time.perf_counter()
                if mode == "serial":
                    timings["apply_cpu"].append(time.process_time() - cpu)
                timings[mode].append(end - start)
                if mode == "serial":
                    timings["apply"].append(end - applying)
                for matcher in matchers.values():
                    assert matcher.accept(token), matcher.error
    masks.close()
    result = {name: median_us(values) for name, values in timings.items()}
    hidden = (result["serial"] - result["overlapped"]) / result["fill"] if result["fill"] else None
    return {"width": width, "steps": len(tokens), "median_us": result,
            "overlap": None if hidden is None else round(hidden, 2),
            "mask_share_of_step_overlapped": round((result["overlapped"] - result["forward"]) / result["forward"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("ASSAY_TEST_REAL", "/tmp/assay-real"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--widths", default="1,8")
    parser.add_argument("--out", default="bench/results/guided_mask.json")
    args = parser.parse_args()
    load_start = os.getloadavg()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    stop = tokenizer.eos_token_id
    report = {"model": args.model, "vocab_size": len(tokenizer), "torch_threads": torch.get_num_threads(),
              "loadavg_start": load_start, "compile": compile_times(tokenizer, stop)}
    compiler = GrammarCompiler(tokenizer, [stop])
    report["widths"] = [width_run(model, tokenizer, compiler, int(w), args.steps) for w in args.widths.split(",")]
    report["loadavg_end"] = os.getloadavg()
    atomic_write_json(Path(args.out), report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
