"""Recall under a fixed state: GLA at several state sizes vs attention (native Qwen3) at the same widths
on MQAR, trained until they converge (or their CPU budget runs out), then a needle grid beyond the
training length on the same checkpoints.

    python bench/gla/recall.py     -> bench/results/recall.json, recall_sweep.png,
                                        recall_needle_{gla,qwen3}.png, a table

Every model: `assay.recall.sweep` (train_recall through assay.train's Trainer), a mixture of the pair
counts at one length, validation every --eval-every steps, stopped at --until-accuracy or after
--budget-min CPU minutes of its own process (CPU, not wall: the machine is shared). Each row records
steps, CPU and wall minutes, and whether it converged; the load average is saved beside.
Models run in parallel worker processes (one torch thread each), each a one-point sweep.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context

from assay.core.files import atomic_write_json
from assay.core.output import print_table
from assay.recall.shapes import layout_for
from assay.recall.needle import NeedleRequest, run_needle
from assay.recall.report import SWEEP_COLUMNS, TABLE_HEADERS, plot_needle, table_rows
from assay.recall.sweep import RecallSweepRequest, plot_sweep, run_sweep, sweep_points



def _sweep_point(request: RecallSweepRequest) -> dict:
    started = time.monotonic()
    result = run_sweep(request)
    return {"rows": result.rows, "models": result.models, "wall_s": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="32,64")
    parser.add_argument("--gla-states", default="4:0.5,1:1", help="GLA (heads:expand_k) settings per width")
    parser.add_argument("--pairs", default="4,16")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--keys", type=int, default=64, help="keys and values in the MQAR vocabulary (chance 1/keys)")
    parser.add_argument("--filler", type=int, default=None, help="filler ids (default: the rest of the zoo's 1,024); vocabulary 64 + 2 x keys + filler")
    parser.add_argument("--budget-min", type=float, default=6.0, help="CPU minutes per model")
    parser.add_argument("--until-accuracy", type=float, default=0.9)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--init-std", type=float, default=RecallSweepRequest.init_std, help="std of the random initial matrices")
    parser.add_argument("--curriculum", action="store_true")
    parser.add_argument("--short-first", type=int, default=None, help="the length curriculum: first this many tokens per sequence")
    parser.add_argument("--attention-heads", type=int, default=RecallSweepRequest.attention_heads, help="attention's heads at every width")
    parser.add_argument("--eval-examples", type=int, default=128)
    parser.add_argument("--patience", type=int, default=None, help="stop a model after this many validations without half a point of progress")
    parser.add_argument("--short-conv", action="store_true", help="every GLA with fla's short convolutions on q, k, v")
    parser.add_argument("--workers", type=int, default=3, help="models trained at once (one process each)")
    parser.add_argument("--needle-width", type=int, default=64)
    parser.add_argument("--needle-lengths", default="64,256,1024")
    parser.add_argument("--needle-trials", type=int, default=16)
    parser.add_argument("--work", type=Path, default=None, help="folder for checkpoints (default: a temporary one)")
    options = parser.parse_args()

    work = options.work or Path(tempfile.mkdtemp(prefix="recall-bench-"))
    widths = tuple(int(x) for x in options.widths.split(","))
    gla_states = tuple((int(h), float(k)) for h, k in (item.split(":") for item in options.gla_states.split(",")))
    layout = layout_for(options.keys, options.filler)
    base = RecallSweepRequest(
        out=work, widths=widths, gla_states=gla_states, pairs=tuple(int(x) for x in options.pairs.split(",")), seq_len=options.seq_len,
        budget_min=options.budget_min, until_accuracy=options.until_accuracy, eval_every=options.eval_every, batch=options.batch,
        lr=options.lr, init_std=options.init_std, curriculum=options.curriculum, short_first=options.short_first, attention_heads=options.attention_heads, layout=layout, eval_examples=options.eval_examples,
        patience=options.patience, gla_short_conv=options.short_conv,
    )
    load_before = os.getloadavg()
    started = time.monotonic()
    one_point = [replace(base, out=work / f"{arch}-{dim}-{i}", widths=(dim,), archs=(arch,), gla_states=(state,))
                 for dim in widths for arch in ("qwen3", "gla") for i, state in enumerate(gla_states if arch == "gla" else gla_states[:1])]
    sweep_points(base)  # every width's GLA settings matched in parameters with attention, before any training
    with ProcessPoolExecutor(max_workers=options.workers, mp_context=get_context("spawn")) as pool:
        parts = list(pool.map(_sweep_point, one_point))
    rows = [row for part in parts for row in part["rows"]]
    models = [model for part in parts for model in part["models"]]
    train_minutes = (time.monotonic() - started) / 60
    load_after_training = os.getloadavg()

    import torch

    torch.set_num_threads(1)  # as in training: tiny models on a shared 2-core machine run best on one thread
    needles = []
    for model in models:
        conv = "-conv" if options.short_conv else ""
        wanted = {"qwen3": f"-d{options.needle_width}-h{options.attention_heads}", "gla": f"-d{options.needle_width}-h4-k0.5{conv}"}
        if not model["name"].endswith(wanted[model["arch"]]):
            continue  # the width's attention model and its GLA at the default state (4 heads, expand_k 0.5)
        needle = run_needle(NeedleRequest(
            model=model["checkpoint"], lengths=tuple(int(x) for x in options.needle_lengths.split(",")),
            depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=options.needle_trials, format="tokens",
        ))
        plot_needle(needle.as_dict(), RESULTS / f"recall_needle_{model['arch']}.png")
        needles.append(needle.as_dict() | {"trained_seq_len": options.seq_len, "converged": model["converged"], "name": model["name"]})

    plot_sweep(rows, RESULTS / "recall_sweep.png", chance=layout.chance,
               title=f"MQAR at {options.seq_len} tokens: accuracy vs decoding state (target {options.until_accuracy:.0%}, "
                     f"{options.budget_min:g} CPU min per model)")
    atomic_write_json(RESULTS / "recall.json", {
        "bench": "recall", "settings": vars(options) | {"work": str(work)}, "chance": layout.chance,
        "train_wall_minutes_total": train_minutes, "loadavg_before": load_before, "loadavg_after_training": load_after_training,
        "loadavg_end": os.getloadavg(), "rows": rows, "models": models, "needle": needles,
    })
    print_table(table_rows(rows), SWEEP_COLUMNS, headers=TABLE_HEADERS,
                title=f"MQAR recall, chance {100 * layout.chance:.2g}% (bench/results/recall.json)")
    for needle in needles:
        cells = [{"length": c["length"], "depth": c["depth"], "accuracy": c["accuracy"]} for c in needle["cells"]]
        print_table(cells, ["length", "depth", "accuracy"], title=f"needle (tokens) on {needle['name']} trained at {needle['trained_seq_len']}")


if __name__ == "__main__":
    main()
