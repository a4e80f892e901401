"""Serving benchmark: the engine on the tiny zoo GLA (and Qwen3 for comparison), CPU, inductor.

    python bench/serve/engine.py          -> bench/results/serve_engine.json, bench/results/serve_engine.png, a table

Four measurements (issue #8's Benchmark section, plus item 5's comparison):
  1. compile share  Poisson arrivals at 20 requests/s, 64 slots: buckets (every width compiled at warm-up)
                    vs none (each new width compiled when first seen). Target: under 5% with buckets.
                    A fresh inductor cache folder per run, so "none" pays what a cold server pays.
  2. throughput     fixed batches of 1, 8, 32 and 64 concurrent sequences: aggregate output tokens/s.
  3. prompt length  batches of 8 sequences at 2,048 vs 8,192 prompt tokens: the cost of one output token
                    (decode-step time / 8). Target: within 2%. Two engines, one per length, are stepped
                    alternately (one decode step each, in turn, the first alternating, for several rounds
                    of 64 tokens), so a
                    change in the machine's load hits both alike: the machine is shared with other
                    processes, and separate runs minutes apart differed by more than 2x in step time.
                    The serve-bench fixed runs at 2K and 8K are recorded too (TTFT includes the prefill).
  4. vs a KV cache  the same through the tiny Qwen3 (a KV cache per slot, sized prompt + 64): bytes per
                    sequence and the per-token cost at 2K vs 8K.
Plus a compiled-vs-eager check: every compiled decode step of a Poisson run also run eagerly.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import statistics
import tempfile
import time
from dataclasses import replace

from assay.core.files import atomic_write_json
from assay.core.metrics import new_figure, save_figure
from assay.core.output import print_table
from assay.serve.bench import ServeBenchRequest, run_serve_bench
from bench.common import RESULTS

COMPILE_SHARE_TARGET = 0.05
PROMPT_COST_TARGET = 0.02
LENGTHS = (2048, 8192)


def per_token_cost(stats: dict) -> float:
    """Seconds per output token at steady width: the engine's median of step time / sequences in the step
    over the steps that did not compile (a compile is the compiler's cost, reported separately)."""
    return stats["output_token_cost_s"]


def interleaved_token_cost(model_path: str, batch: int = 8, tokens: int = 64, rounds: int = 4, seed: int = 0) -> dict:
    """Seconds per output token at each prompt length, two engines stepped alternately (see the docstring)."""
    import random

    import torch

    from assay.serve import Engine, EngineConfig
    from assay.serve.runner.weights import load_slot_model
    from assay.serve.bench import corpus_token_ids, make_prompts

    folder = Path(model_path)
    slot_model = load_slot_model(folder, torch.device("cpu"), max(LENGTHS) + tokens)
    engines = {
        length: Engine(
            slot_model,
            EngineConfig(max_seqs=batch, buckets=(batch,), max_prompt_tokens=length, max_new_tokens=tokens, max_len=length + tokens),
            tokenizer_dir=folder,
        )
        for length in LENGTHS
    }
    for engine in engines.values():
        engine.warm_up()
    corpus = corpus_token_ids(engines[LENGTHS[0]].tokenizer)
    rng = random.Random(seed)
    for round_index in range(rounds):
        for length, engine in engines.items():
            for index, prompt in enumerate(make_prompts(corpus, length, batch, rng)):
                engine.add_request(f"{round_index}-{index}", prompt, tokens)
            engine.step()  # prefill every prompt (not timed as decode) and the first decode step
        turn = 0
        while any(engine.has_unfinished() for engine in engines.values()):
            # One decode step each, in turn; who goes first alternates, so neither length always runs
            # right after the other (caches, the allocator, a neighbour's burst of work).
            order = list(engines.values()) if turn % 2 == 0 else list(engines.values())[::-1]
            for engine in order:
                if engine.has_unfinished():
                    engine.step()
            turn += 1
    result = {}
    for length, engine in engines.items():
        per_token = [r.step_s / r.running for r in engine.stats().steps if not r.compiled and r.running == batch]
        result[str(length)] = {
            "steps": len(per_token), "median_s_per_token": statistics.median(per_token), "min_s_per_token": min(per_token),
            "state_bytes_per_sequence": engine.stats().memory.state_bytes_per_sequence,
        }
    first, last = (result[str(n)] for n in LENGTHS)
    result["relative_change_median"] = last["median_s_per_token"] / first["median_s_per_token"] - 1
    result["relative_change_min"] = last["min_s_per_token"] / first["min_s_per_token"] - 1
    return result


def run(request: ServeBenchRequest) -> list[dict]:
    result = run_serve_bench(request, progress=True)
    runs = []
    for run_ in result.runs:
        entry = {
            "arrivals": run_.arrivals, "mode": run_.mode, "prompt_tokens": run_.prompt_tokens, "concurrency": run_.concurrency,
            "requests_sent": run_.requests_sent, "requests_finished": run_.requests_finished, "timed_out": run_.timed_out,
            "wall_s": run_.wall_s, "summary": run_.summary(), "stats": run_.stats,
        }
        runs.append(entry)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=None, help="an existing zoo folder with gla and qwen3 (default: build them)")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_engine.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "serve_engine.png")
    parser.add_argument("--quick", action="store_true", help="a small version of every measurement (minutes)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, see below)")
    args = parser.parse_args()
    # One thread: the tiny model (width 64) gains nothing from intra-op parallelism (on an idle machine 1 and 2
    # threads ran a width-64 decode step in 1.0 ms alike), while on a machine shared with other jobs a
    # 2-thread parallel region waits whenever its partner thread is descheduled: runs of the same
    # configuration minutes apart then differed by up to 100x in step and prefill time.
    import torch

    torch.set_num_threads(args.threads)
    from assay.core.cli import quiet_libraries

    quiet_libraries()
    started = time.time()
    zoo = args.zoo
    if zoo is None:
        from assay.zoo import build_zoo

        zoo = Path(tempfile.mkdtemp(prefix="serve-bench-zoo-"))
        build_zoo(zoo, names=["gla", "qwen3"], progress=False)
    gla, qwen3 = str(zoo / "gla"), str(zoo / "qwen3")
    scale = 4 if args.quick else 1

    # 1. compile share under Poisson arrivals, buckets vs none
    poisson = ServeBenchRequest(
        model=gla, arrivals="poisson", rate=20.0, requests=200 // scale, prompt_tokens=(128,), max_tokens=64,
        modes=("buckets", "none"), max_seqs=64, time_limit_s=300, seed=0,
        # Admissions spread over steps (8 prompts of 128 per step at most): the running count moves the
        # way staggered arrivals move it, instead of jumping to 64 behind one long burst of prefills.
        max_prefill_tokens=1024,
    )
    compile_runs = run(poisson)
    # compiled vs eager on the exact inputs of every decode step (buckets, cache of the run above gone: fresh)
    eager_runs = run(replace(poisson, requests=40 // scale, modes=("buckets",), check_eager=True))
    # 2. throughput at fixed concurrency (compile cost is not what this measures: the cache is reused)
    throughput_runs = run(
        ServeBenchRequest(
            model=gla, arrivals="fixed", concurrency=(1, 8, 32, 64), requests=64 // scale, prompt_tokens=(128,),
            max_tokens=64, modes=("buckets",), max_seqs=64, fresh_compile_cache=False, time_limit_s=400,
        )
    )
    # 3. prompt 2K vs 8K, interleaved, repeated; 4. the same through Qwen3's KV cache
    prompt_runs = {"gla": [], "qwen3": []}
    interleaved = {}
    for model_name, path in (("gla", gla), ("qwen3", qwen3)):
        interleaved[model_name] = interleaved_token_cost(path, rounds=1 if args.quick else (6 if model_name == "gla" else 3))
        prompt_runs[model_name] += run(
            ServeBenchRequest(
                model=path, arrivals="fixed", concurrency=(8,), requests=16 // (2 if args.quick else 1),
                prompt_tokens=(2048, 8192), max_tokens=64, modes=("buckets",), buckets=(1, 2, 4, 8), max_seqs=8,
                fresh_compile_cache=False, time_limit_s=600,
            )
        )

    # ---- summary and targets
    by_mode = {r["mode"]: r for r in compile_runs}
    share_buckets = by_mode["buckets"]["stats"]["compile_share"]
    share_none = by_mode["none"]["stats"]["compile_share"]
    throughput = {r["concurrency"]: r["stats"]["output_tokens_per_s"] for r in throughput_runs}
    cost = {(name, length): interleaved[name][str(length)]["median_s_per_token"] for name in interleaved for length in LENGTHS}
    gla_delta = cost[("gla", 8192)] / cost[("gla", 2048)] - 1
    qwen_delta = cost[("qwen3", 8192)] / cost[("qwen3", 2048)] - 1
    memory = {
        model_name: {
            str(r["prompt_tokens"]): r["stats"]["memory"]["state_bytes_per_sequence"] for r in runs[:2]
        }
        for model_name, runs in prompt_runs.items()
    }
    eager_check = eager_runs[0]["stats"]["eager_check"]
    none_stats = by_mode["none"]["stats"]
    summary = {
        "compile_share": {
            "buckets": share_buckets, "none": share_none, "target_buckets_below": COMPILE_SHARE_TARGET,
            "met": share_buckets is not None and share_buckets < COMPILE_SHARE_TARGET,
            "buckets_warmup_compiles": by_mode["buckets"]["stats"]["warmup_compiles"],
            "buckets_warmup_s": by_mode["buckets"]["stats"]["warmup_s"],
            "none_compiles": none_stats["compiles"], "none_compile_s": none_stats["compile_s"],
            "none_compiled_step_fraction": none_stats["compiled_step_fraction"],
            "none_decode_steps": none_stats["decode_steps"],
        },
        "output_tokens_per_s_by_concurrency": {str(k): v for k, v in throughput.items()},
        # decode steps alone (no prefill, no waiting): sequences x steps / decode time
        "decode_tokens_per_s_by_concurrency": {str(r["concurrency"]): r["stats"]["decode_tokens_per_s"] for r in throughput_runs},
        "prompt_length_output_token_cost": {
            "gla_s_per_token": {"2048": cost[("gla", 2048)], "8192": cost[("gla", 8192)]},
            "gla_relative_change": gla_delta, "target_within": PROMPT_COST_TARGET, "met": abs(gla_delta) <= PROMPT_COST_TARGET,
            "qwen3_s_per_token": {"2048": cost[("qwen3", 2048)], "8192": cost[("qwen3", 8192)]},
            "qwen3_relative_change": qwen_delta,
            "interleaved": interleaved,
            "serve_bench_fixed_runs_s_per_token": {
                name: {str(r["prompt_tokens"]): per_token_cost(r["stats"]) for r in runs} for name, runs in prompt_runs.items()
            },
        },
        "bytes_per_sequence": memory,
        "gla_kv_reference": compile_runs[0]["stats"]["memory"],
        "compiled_vs_eager": eager_check,
        "wall_s": time.time() - started,
        "torch_threads": args.threads,
    }
    payload = {
        "summary": summary,
        "runs": {"compile_share": compile_runs, "eager_check": eager_runs, "throughput": throughput_runs, "prompt_length": prompt_runs},
    }
    atomic_write_json(args.out, payload)
    plot(summary, args.plot)
    print_table([r["summary"] for r in compile_runs + throughput_runs + prompt_runs["gla"] + prompt_runs["qwen3"]],
                ["arrivals", "mode", "prompt", "concurrency", "requests", "compiles", "compile_share", "tokens_per_s",
                 "ttft_p50", "tpot_p50", "tpot_p99", "state_bytes"], title="serve bench runs")
    print_table(
        [
            {"target": "compile share with buckets < 5%", "measured": f"{100 * share_buckets:.2f}% (none: {100 * share_none:.1f}%)",
             "met": summary["compile_share"]["met"]},
            {"target": "GLA output-token cost 2K vs 8K within 2%", "measured": f"{100 * gla_delta:+.2f}% (Qwen3 KV: {100 * qwen_delta:+.1f}%)",
             "met": summary["prompt_length_output_token_cost"]["met"]},
        ],
        ["target", "measured", "met"], title=f"targets ({args.out})",
    )


def plot(summary: dict, path: Path) -> None:
    fig, axes = new_figure(ncols=4, size=(4.2, 3.8))
    share_ax, throughput_ax, cost_ax, memory_ax = axes[0]
    shares = summary["compile_share"]
    share_ax.bar(["buckets", "none"], [100 * shares["buckets"], 100 * shares["none"]], color=["tab:blue", "tab:red"])
    share_ax.axhline(100 * COMPILE_SHARE_TARGET, color="gray", linestyle="--", label="target 5%")
    share_ax.set_ylabel("compile share of decode time (%)")
    share_ax.set_title("Poisson arrivals")
    share_ax.legend(fontsize=7)
    # JSON keys are strings ("1", "32", "64", "8"): sort by concurrency so the line runs left to right.
    throughput = sorted((int(k), v) for k, v in summary["output_tokens_per_s_by_concurrency"].items())
    throughput_ax.plot([k for k, _ in throughput], [v for _, v in throughput], marker="o")
    throughput_ax.set_xscale("log", base=2)
    throughput_ax.set_xlabel("concurrent sequences")
    throughput_ax.set_ylabel("output tokens/s (all sequences)")
    throughput_ax.set_title("fixed batches, buckets")
    costs = summary["prompt_length_output_token_cost"]
    for offset, (name, color) in enumerate((("gla", "tab:green"), ("qwen3", "tab:purple"))):
        values = costs[f"{name}_s_per_token"]
        cost_ax.bar([offset * 3 + 0, offset * 3 + 1], [1000 * values["2048"], 1000 * values["8192"]], color=color, label=name)
    cost_ax.set_xticks([0, 1, 3, 4])
    cost_ax.set_xticklabels(["GLA 2K", "GLA 8K", "Qwen3 2K", "Qwen3 8K"], fontsize=8, rotation=20)
    cost_ax.set_ylabel("ms per output token (batch of 8)")
    cost_ax.set_title("prompt length")
    memory = summary["bytes_per_sequence"]
    labels, values = [], []
    for name in ("gla", "qwen3"):
        for length, value in memory[name].items():
            labels.append(f"{name} {int(length) // 1024}K")
            values.append(value / 1024)
    memory_ax.bar(labels, values, color=["tab:green", "tab:green", "tab:purple", "tab:purple"])
    memory_ax.set_yscale("log")
    memory_ax.set_ylabel("KiB per sequence")
    memory_ax.set_title("state vs KV cache")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
