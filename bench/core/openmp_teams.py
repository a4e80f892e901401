"""What a second OpenMP team costs: `python bench/core/openmp_teams.py [--model smollm2/]`
    -> bench/results/openmp_teams.json, openmp_teams.png

The same work timed three ways, in rounds: on the main thread (which made its OpenMP team first); on another
thread while the main thread's team lives (two teams: how a server that loads on its main thread and steps an
engine thread ran); on another thread after the main thread released its team (assay.core.openmp's
release_openmp_workers, which the serving engine's loop calls as it starts). The work: linears of SmolLM2-135M's
shapes (1 and 8 rows, 576 -> 1536) and, with --model, the serving engine's step of one sequence (eager, or
compiled with --compile). Medians over the rounds; libgomp's path, the CPU and its load are saved with them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import statistics
import threading
import time

import torch

from assay.core.files import atomic_write_json
from assay.core.metrics import save_figure
from assay.core.openmp import loaded_libgomp, release_openmp_workers
from assay.core.output import print_table
from bench.common import RESULTS, corpus_prompts, machine

SETTINGS = ("main thread", "other thread, two teams", "other thread, main's team released")


def linear_case(rows: int, calls: int):
    x, weight = torch.randn(rows, 576), torch.randn(1536, 576)

    def run() -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    return run


def engine_case(model: Path, compiled: bool, tokens: int):
    """The serving engine's step, one sequence of a 128-token prompt: the median of its decode steps."""
    from assay.serve import Engine, EngineConfig

    engine = Engine.from_checkpoint(model, EngineConfig(max_seqs=1, max_len=256, buckets="1", eager=not compiled))
    engine.warm_up()
    prompt = corpus_prompts(model, 1, 128)[0]
    count = iter(range(10**9))

    def run() -> float:
        engine.add_request(f"r{next(count)}", prompt, max_tokens=tokens, temperature=0)
        times = []
        while engine.has_unfinished():
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])  # the first step is the prefill
    return run


def on_thread(fn) -> float:
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a real checkpoint folder: also time the serving engine's step of one sequence")
    parser.add_argument("--compile", action="store_true", help="the engine's decode compiled with inductor (width 1) rather than eager")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=RESULTS / "openmp_teams.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cases = {"linear 1 x 576 -> 1536": linear_case(1, 2000), "linear 8 x 576 -> 1536": linear_case(8, 2000)}
    if args.model is not None:
        print(f"loading {args.model} and warming up its engine{' (compiling width 1)' if args.compile else ''} ...", flush=True)
        cases[f"engine step, 1 sequence ({'compiled' if args.compile else 'eager'})"] = engine_case(args.model, args.compile, 33)
    seconds: dict[str, dict[str, list[float]]] = {case: {s: [] for s in SETTINGS} for case in cases}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", flush=True)
        for case, run in cases.items():
            seconds[case][SETTINGS[0]].append(run())  # the main thread's team exists from here on
            seconds[case][SETTINGS[1]].append(on_thread(run))
            release_openmp_workers()
            seconds[case][SETTINGS[2]].append(on_thread(run))

    rows = []
    for case, by_setting in seconds.items():
        medians = {s: statistics.median(v) for s, v in by_setting.items()}
        rows.append({"work": case, **{f"{s}, ms": medians[s] * 1000 for s in SETTINGS},
                     "two teams / main": medians[SETTINGS[1]] / medians[SETTINGS[0]],
                     "released / main": medians[SETTINGS[2]] / medians[SETTINGS[0]]})
    record = {"benchmark": "openmp_teams", "machine": machine(), "torch": torch.__version__, "threads": args.threads,
              "libgomp": str(loaded_libgomp()), "rounds": args.rounds, "model": str(args.model) if args.model else None,
              "rows": rows, "seconds": seconds}
    atomic_write_json(args.out, record)
    plot(record, args.out.with_suffix(".png"))
    print_table(rows, list(rows[0]), title=f"{args.threads} threads, {record['machine']['cpu']}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = record["rows"]
    fig, axis = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(SETTINGS)
    for index, setting in enumerate(SETTINGS):
        xs = [i + (index - 1) * width for i in range(len(rows))]
        axis.bar(xs, [row[f"{setting}, ms"] / row[f"{SETTINGS[0]}, ms"] for row in rows], width, label=setting)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(rows)), [row["work"] for row in rows], fontsize=8)
    axis.set_ylabel("time / main thread's (lower is better)")
    axis.legend(fontsize=8)
    axis.set_title(f"OpenMP teams: {record['threads']} threads, {record['machine']['cpu']}", fontsize=10)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
