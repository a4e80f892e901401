"""Recall under a fixed state: GLA vs attention (native Qwen3) of matched size on MQAR, as pairs grow.

    python bench/recall_bench.py     -> bench/results/recall_bench.json, recall_bench.png, recall_needle.png, a table

One model per (architecture, length), trained through assay.train's Trainer on a mixture of the pair
counts that fit the length, then scored per pair count on held-out sequences. Both architectures get
the same steps and tokens per step (same data); each model also stops at a wall-minute cap so the
whole bench stays under about 25 minutes on a shared 2-core machine. Steps done and minutes used are
recorded beside every accuracy: minutes are noisy here, steps are not.

Then a needle grid (token format) on the two longer-length models: one key-value pair at a depth of
filler, asked at the end, at lengths up to 16x the training length.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from assay.core.files import atomic_write_json
from assay.core.output import print_table
from assay.recall.models import ModelSize
from assay.recall.mqar import MQARSpec
from assay.recall.needle import NeedleRequest, run_needle
from assay.recall.report import TABLE_COLUMNS, TABLE_HEADERS, plot_accuracy, plot_needle, table_rows
from assay.recall.train import RecallTrainRequest, train_recall

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="64,256")
    parser.add_argument("--pairs", default="4,16,64")
    parser.add_argument("--keys", type=int, default=64, help="keys and values in the MQAR vocabulary (chance 1/keys)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--budget-min", type=float, default=7.0, help="wall-minute cap per model")
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-examples", type=int, default=128)
    parser.add_argument("--needle-lengths", default="256,1024,4096")
    parser.add_argument("--needle-trials", type=int, default=16)
    parser.add_argument("--work", type=Path, default=None, help="folder for checkpoints (default: a temporary one)")
    options = parser.parse_args()

    work = options.work or Path(tempfile.mkdtemp(prefix="recall-bench-"))
    seq_lens = tuple(int(x) for x in options.seq_lens.split(","))
    layout = MQARSpec(n_keys=options.keys, n_values=options.keys)
    request = RecallTrainRequest(
        out=work, pairs=tuple(int(x) for x in options.pairs.split(",")), seq_lens=seq_lens, steps=options.steps,
        budget_min=options.budget_min, tokens_per_step=options.tokens_per_step, lr=options.lr, layout=layout,
        size=ModelSize(), eval_examples=options.eval_examples, progress=True,
    )
    started = time.monotonic()
    result = train_recall(request)
    train_minutes = (time.monotonic() - started) / 60

    import torch

    torch.set_num_threads(1)  # as in training: tiny models on a shared 2-core machine run best on one thread
    needles = []
    longest = max(seq_lens)
    for arch in request.archs:
        checkpoint = work / "models" / f"{arch}-L{longest}"
        needle = run_needle(NeedleRequest(
            model=str(checkpoint), lengths=tuple(int(x) for x in options.needle_lengths.split(",")),
            depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=options.needle_trials, format="tokens",
        ))
        plot_needle(needle.as_dict(), RESULTS / f"recall_needle_{arch}.png")
        needles.append(needle.as_dict() | {"trained_seq_len": longest})

    plot_accuracy(result.rows, RESULTS / "recall_bench.png", chance=layout.chance,
                  title=f"MQAR: GLA vs attention, matched size ({result.params['gla']:,} / {result.params['qwen3']:,} params)")
    atomic_write_json(RESULTS / "recall_bench.json", {
        "bench": "recall", "settings": vars(options) | {"work": str(work)}, "chance": layout.chance, "params": result.params,
        "train_minutes_total": train_minutes, "rows": result.rows, "models": result.models, "needle": needles,
    })
    print_table(table_rows(result.rows), TABLE_COLUMNS, headers=TABLE_HEADERS,
                title=f"MQAR recall, chance {100 * layout.chance:.2g}% (bench/results/recall_bench.json)")
    for needle in needles:
        rows = [{"length": c["length"], "depth": c["depth"], "accuracy": c["accuracy"]} for c in needle["cells"]]
        print_table(rows, ["length", "depth", "accuracy"], title=f"needle (tokens) on {needle['kind']} trained at {needle['trained_seq_len']}")


if __name__ == "__main__":
    main()
