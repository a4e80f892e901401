"""Where gla_chunk shows: the GLA model's training step and prefill, gla_chunk as of a base commit vs now.

    python bench/gla/model.py        -> bench/results/gla_model.json and a table

The zoo's GLA architecture (`zoo/gla`: the `tiny` flavour, 2 layers, 4 heads of K=8, V=16) and a
wider one whose heads have the kernel benchmark's width (`--wide`: 4 heads of K=V=64, 2 layers),
random init. Two jobs, each timed with the layers' gla_chunk as of --before (loaded from git into
this process) and as now, alternating run by run so both see the same load:
- train: forward + backward + AdamW step on one sequence of --seq tokens (what `assay train` runs
  per step; tokens/s = tokens / step time);
- prefill: model.prefill on one prompt of --seq tokens under no_grad (what `assay serve` runs
  before decoding).
Best of the rounds (a shared machine slows runs, never speeds them up); load averages recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import time
from dataclasses import replace

import torch

import assay.models.common.linear_attention as layers  # GLAOperator reads gla_chunk from this module
from assay.core.files import atomic_write_json
from assay.core.output import print_table
from assay.kernels.gla import gla_chunk
from assay.models.gla import FLAVOURS, GLA

from bench.common import RESULTS
from bench.gla.kernel import load_before  # the kernel bench's git loader, one copy



def time_job(model, job: str, tokens: torch.Tensor, optimizer) -> float:
    start = time.perf_counter()
    if job == "train":
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            model.prefill(tokens)
    return time.perf_counter() - start


def run(seq: int, rounds: int, before_rev: str, wide: bool) -> dict:
    kernels = {f"gla_chunk@{before_rev}": load_before(before_rev), "gla_chunk": gla_chunk}
    models = {"zoo/gla (tiny)": FLAVOURS["tiny"]}
    if wide:
        models["wide (H=4, K=V=64)"] = replace(FLAVOURS["tiny"], dim=256, n_heads=4, expand_k=1.0)
    rows, loads = [], []
    for model_name, args in models.items():
        model = GLA.build(args)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, args.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
        for job in ("train", "prefill"):
            times = {name: [] for name in kernels}
            for round_index in range(rounds + 1):  # round 0 warms up
                loads.append(os.getloadavg()[0])
                for name, kernel in kernels.items() if round_index % 2 == 0 else reversed(kernels.items()):
                    layers.gla_chunk = kernel
                    seconds = time_job(model, job, tokens, optimizer)
                    if round_index:
                        times[name].append(seconds)
            for name, samples in times.items():
                rows.append({"model": model_name, "job": job, "kernel": name, "seq": seq, "best_s": min(samples),
                             "tokens_per_s": seq / min(samples), "runs": len(samples)})
    layers.gla_chunk = gla_chunk
    return {
        "config": {"seq": seq, "rounds": rounds, "before": before_rev, "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "loadavg_1min_per_round": loads, "loadavg_end": os.getloadavg(), "cores": os.cpu_count()},
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per job (alternating order)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--before", default="2e46294", help="git revision whose gla_chunk is timed as 'before'")
    parser.add_argument("--no-wide", dest="wide", action="store_false", help="only the zoo's tiny model")
    parser.add_argument("--out", default=str(RESULTS / "gla_model.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.seq, args.rounds, args.before, args.wide)
    atomic_write_json(Path(args.out), result)
    table = [{"model": r["model"], "job": r["job"], "kernel": r["kernel"], "tokens/s": f"{r['tokens_per_s']:,.0f}",
              "best ms": f"{1000 * r['best_s']:.1f}"} for r in result["rows"]]
    print_table(table, list(table[0].keys()), title=f"GLA model, {args.seq} tokens, {args.threads} threads")
    print(f"wrote {args.out} (load {result['config']['loadavg_end']})")


if __name__ == "__main__":
    sys.exit(main())
