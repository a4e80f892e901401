"""The real judge's scores on English prose, the same prose shuffled, and random tokens: where its
fluency threshold comes from (assay/compat/probe/judge.py, docs/judge.md).

    python bench/compat/judge_scores.py                 -> bench/results/judge_scores.json and a table
    python bench/compat/judge_scores.py --judge FOLDER  -> another judge

Texts, each cut to the judge's first N tokens for N in --lengths (32 is what a default sharded probe
generates, so the threshold must hold there; longer texts give the judge more context and lower loss):
- prose: paragraphs of the embedded corpus (CPython's documentation topics): the held-out split's and
  a seeded sample of the training split's;
- shuffled words and shuffled tokens: the same text in a random order (English words, no English order);
- random tokens: ids drawn uniformly from the judge's vocabulary, decoded.
Scores are judge_text's own: the mean next-token loss in nats and the share of repeated word bigrams.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import os
import platform
import random
import statistics
import time

from assay.compat.probe.judge import MAX_REPEATED, loss_threshold, repeated_bigram_share, text_loss  # noqa: E402
from assay.core.files import atomic_write_json  # noqa: E402
from assay.core.output import print_table  # noqa: E402
from assay.zoo.corpus import corpus_split  # noqa: E402
from bench.common import RESULTS

KINDS = ("prose", "shuffled words", "shuffled tokens", "random tokens")


def paragraphs(count: int, seed: int) -> list[str]:
    """Prose paragraphs of at least 400 characters, without code blocks (indented lines) or tables."""
    train, held_out = corpus_split()

    def prose(text: str) -> list[str]:
        found = []
        for block in text.split("\n\n"):
            lines = block.splitlines()
            if len(block) > 400 and not any(line.startswith((" ", ">>>", "+", "|", "=")) for line in lines):
                found.append(" ".join(line.strip() for line in lines))
        return found

    held = prose(held_out)
    rng = random.Random(seed)
    rest = prose(train)
    return held[: count // 2] + rng.sample(rest, count - min(len(held), count // 2))


def texts(tokenizer, paragraph: str, length: int, rng: random.Random) -> dict[str, str]:
    ids = tokenizer(paragraph)["input_ids"][:length]
    shuffled_ids = ids[:]
    rng.shuffle(shuffled_ids)
    prose = tokenizer.decode(ids)
    words = prose.split()
    rng.shuffle(words)
    noise = [rng.randrange(tokenizer.vocab_size) for _ in ids]
    return {"prose": prose, "shuffled words": " ".join(words), "shuffled tokens": tokenizer.decode(shuffled_ids),
            "random tokens": tokenizer.decode(noise)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", help="judge folder (default: the real model, converted into the user cache)")
    parser.add_argument("--paragraphs", type=int, default=24)
    parser.add_argument("--lengths", default="32,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "judge_scores.json")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoTokenizer

    torch.manual_seed(args.seed)
    if args.judge is None:
        from assay.compat.probe.judge import default_judge

        args.judge = default_judge()
    tokenizer = AutoTokenizer.from_pretrained(args.judge)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    threshold = loss_threshold(args.judge)
    samples = []
    for length in [int(n) for n in args.lengths.split(",")]:
        for index, paragraph in enumerate(paragraphs(args.paragraphs, args.seed)):
            for kind, text in texts(tokenizer, paragraph, length, rng).items():
                loss, tokens = text_loss(text, args.judge)
                repeated = repeated_bigram_share(text)
                # judge_text's verdict, from the same two numbers (without scoring the text twice)
                fluent = loss <= threshold and repeated <= MAX_REPEATED
                samples.append({"length": length, "paragraph": index, "kind": kind, "loss": loss, "tokens": tokens,
                                "repeated_bigrams": repeated, "fluent": fluent, "text": text})
    summary = []
    for length in sorted({s["length"] for s in samples}):
        for kind in KINDS:
            losses = [s["loss"] for s in samples if s["length"] == length and s["kind"] == kind]
            fluent = [s["fluent"] for s in samples if s["length"] == length and s["kind"] == kind]
            summary.append({"length": length, "kind": kind, "n": len(losses), "min": min(losses), "median": statistics.median(losses),
                            "max": max(losses), "judged_fluent": sum(fluent)})
    result = {
        "judge": args.judge, "threshold": threshold, "summary": summary, "samples": samples,
        "seconds": time.perf_counter() - started, "loadavg": os.getloadavg(), "host": platform.node(),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    atomic_write_json(args.out, result)
    print_table(summary, ["length", "kind", "n", "min", "median", "max", "judged_fluent"],
                title=f"judge losses (nats/token), threshold {result['threshold']:.2f}: {args.out}")


if __name__ == "__main__":
    main()
