"""What structured outputs cost the engine on the real SmolLM2-135M-Instruct: decode tokens per second with every
sequence under a JSON schema against the same engine unconstrained, at widths 1 and 8, and the time to first
token of a schema's first request (compiled) against its second (the compiler's cache).

    python bench/serve/guided.py [--model DIR] [--widths 1,8] [--steps 32] [--rounds 3] [--mode eager|buckets]
        -> bench/results/serve_guided.json and .png (with os.getloadavg() at the start and the end)

Decode: W requests of one chat prompt each decode --steps tokens (max_tokens = steps + 1, and a schema long
enough that no row finishes early), greedy; the rate is the tokens of the decode steps over their wall time
(engine.step() after every first token: the forward, the mask fill on its worker thread, the mask, the draw).
Rounds alternate free and guided, so a loaded machine's noise falls on both; the median round is reported.
Goal: guided >= 0.9 x free at each width.

TTFT: a fresh schema (an enum value no earlier request used) is compiled and submitted, and the clock stops at
its first token; then the same schema again, from the cache. Each pair is repeated --rounds times with new
schemas; the compile (or the cache look-up) is also timed apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import statistics
import time

from bench.common import RESULTS, load_average, machine
from assay.core.files import atomic_write_json
from assay.core.metrics import new_figure, save_figure
from assay.core.output import print_table

GOAL = 0.9
MESSAGES = [{"role": "user", "content": "Write a made-up customer record as JSON."}]


def long_schema(tag: str) -> dict:
    """Nested objects, enums, integers and a fixed-length array: longer than any decode run, so no row finishes."""
    return {"type": "object", "additionalProperties": False, "required": ["id", "kind", "owner", "notes"], "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 10**6},
        "kind": {"enum": ["retail", "wholesale", tag]},
        "owner": {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                  "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 18, "maximum": 99}}},
        "notes": {"type": "array", "minItems": 40, "maxItems": 40, "items": {"type": "string", "minLength": 4, "maxLength": 16}},
    }}


def build(args):
    from assay.serve import Engine, EngineConfig
    from assay.serve.guided import GrammarCompiler, render_chat

    engine = Engine.from_checkpoint(args.model, EngineConfig(max_seqs=max(args.widths), eager=args.mode == "eager", max_len=512,
                                                             buckets=tuple(args.widths) if args.mode == "buckets" else "auto"))
    engine.warm_up()
    tokenizer = engine.tokenizer
    prompt = tokenizer.encode(render_chat(tokenizer, MESSAGES), add_special_tokens=False)
    return engine, GrammarCompiler(tokenizer, [tokenizer.eos_token_id]), prompt, tokenizer.eos_token_id


def decode_rate(engine, prompt, eos, width: int, steps: int, grammar) -> float:
    from assay.serve import SamplingParams

    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, stop_token_ids=(eos,), grammar=grammar)
    for i in range(width):
        engine.add_request(f"w{width}-{i}-{time.monotonic_ns()}", prompt, params=params)
    tokens, seconds, firsts = 0, 0.0, 0
    while engine.has_unfinished():
        start = time.perf_counter()
        events = engine.step()
        elapsed = time.perf_counter() - start
        if firsts >= width:  # every row has its first token: this step was decode only
            tokens += sum(e.token_id >= 0 for e in events)
            seconds += elapsed
        firsts += sum(e.index == 0 for e in events)
    return tokens / seconds


def first_token_s(engine, compiler, prompt, eos, schema: dict) -> tuple[float, float]:
    """(seconds to the first token, of which the grammar's compile or cache look-up)."""
    from assay.serve import SamplingParams

    start = time.perf_counter()
    grammar = compiler.json_schema(schema, strict=True)
    compiled = time.perf_counter()
    engine.add_request(f"ttft-{time.monotonic_ns()}", prompt, params=SamplingParams(max_tokens=1, temperature=0.0, stop_token_ids=(eos,),
                                                                                   grammar=grammar))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start, compiled - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("ASSAY_TEST_REAL", "/tmp/assay-real"))
    parser.add_argument("--widths", default="1,8")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=["eager", "buckets"], default="eager")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_guided.json")
    args = parser.parse_args()
    args.widths = [int(w) for w in args.widths.split(",")]
    load_start = load_average()
    engine, compiler, prompt, eos = build(args)
    grammar = compiler.json_schema(long_schema("internal"), strict=True)
    decode_rate(engine, prompt, eos, max(args.widths), 4, grammar)  # warm: first masks, allocator, caches

    rates = {w: {"free": [], "guided": []} for w in args.widths}
    for _ in range(args.rounds):
        for width in args.widths:
            rates[width]["free"].append(decode_rate(engine, prompt, eos, width, args.steps, None))
            rates[width]["guided"].append(decode_rate(engine, prompt, eos, width, args.steps, grammar))
    decode = []
    for width, pair in rates.items():
        free, guided = statistics.median(pair["free"]), statistics.median(pair["guided"])
        decode.append({"width": width, "free_tokens_per_s": free, "guided_tokens_per_s": guided, "ratio": guided / free,
                       "goal_met": guided / free >= GOAL, "rounds": pair})

    pairs = []
    for round_ in range(args.rounds):
        schema = long_schema(f"fresh-{os.getpid()}-{round_}")
        compiles = compiler.compiles
        first, first_compile = first_token_s(engine, compiler, prompt, eos, schema)
        second, second_compile = first_token_s(engine, compiler, prompt, eos, schema)
        pairs.append({"first_s": first, "second_s": second, "first_compile_s": first_compile, "second_compile_s": second_compile,
                      "compiled_once": compiler.compiles == compiles + 1})
    result = {
        "model": str(args.model), "mode": args.mode, "steps": args.steps, "rounds": args.rounds, "goal_ratio": GOAL,
        "decode": decode,
        "ttft": {key: statistics.median(p[key] for p in pairs) for key in ("first_s", "second_s", "first_compile_s", "second_compile_s")}
        | {"pairs": pairs},
        "threads": __import__("torch").get_num_threads(), "cpu_count": os.cpu_count(), "machine": machine(),
        "loadavg_start": load_start, "loadavg_end": load_average(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    rows = [{"width": d["width"], "free tok/s": f"{d['free_tokens_per_s']:.1f}", "guided tok/s": f"{d['guided_tokens_per_s']:.1f}",
             "ratio": f"{d['ratio']:.3f}", "goal >= 0.9": str(d["goal_met"])} for d in decode]
    print_table(rows, list(rows[0]))
    ttft = result["ttft"]
    print(f"TTFT, a schema's first request {ttft['first_s'] * 1000:.1f} ms (compile {ttft['first_compile_s'] * 1000:.2f} ms), its second "
          f"{ttft['second_s'] * 1000:.1f} ms (cache {ttft['second_compile_s'] * 1000:.3f} ms); "
          f"load {load_start[0]:.1f} -> {result['loadavg_end'][0]:.1f}; {args.out}")


def plot(result: dict, path: Path) -> None:
    fig, axes = new_figure(ncols=2, size=(5.0, 4.0))
    rates, ttft = axes[0]
    widths = [str(d["width"]) for d in result["decode"]]
    x = range(len(widths))
    rates.bar([i - 0.2 for i in x], [d["free_tokens_per_s"] for d in result["decode"]], 0.4, label="free")
    rates.bar([i + 0.2 for i in x], [d["guided_tokens_per_s"] for d in result["decode"]], 0.4, label="JSON schema")
    rates.set_xticks(list(x), widths)
    rates.set_xlabel("decode width")
    rates.set_ylabel("decode tokens/s")
    rates.legend()
    ttft.bar(["first (compile)", "second (cached)"], [result["ttft"]["first_s"] * 1000, result["ttft"]["second_s"] * 1000])
    ttft.set_ylabel("time to first token, ms")
    load = result["loadavg_start"][0]
    fig.suptitle(f"SmolLM2-135M, {result['mode']}, load average {load:.1f} on {result['cpu_count']} cores")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
