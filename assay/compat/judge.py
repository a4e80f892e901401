"""The sharded probe's judge: is a generated text fluent English?

A small causal LM (`--judge`) scores the text by its mean per-token loss, and a repetition check
catches the loops a broken model falls into. Fluency is neither semantic correctness nor numerical
equality: a judged PASS does not replace a comparison with a single-device run (compat.md).

Thresholds, relative to the judge's vocabulary V (uniform guessing scores ln V):
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


@dataclass(frozen=True)
class Verdict:
    fluent: bool
    loss: float
    loss_threshold: float
    repeated_bigrams: float
    reason: str


@functools.lru_cache(maxsize=2)
def _load(judge_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge_path)
    model = AutoModelForCausalLM.from_pretrained(judge_path, dtype=torch.float32).eval()
    return tokenizer, model


def repeated_bigram_share(text: str) -> float:
    words = text.split()
    bigrams = list(zip(words, words[1:]))
    if not bigrams:
        return 0.0
    return 1.0 - len(set(bigrams)) / len(bigrams)


def judge_text(text: str, judge_path: str) -> Verdict:
    tokenizer, model = _load(judge_path)
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, : model.config.max_position_embeddings]
    threshold = LOSS_FRACTION * math.log(model.config.vocab_size)
    repeated = repeated_bigram_share(text)
    if ids.shape[1] < 2 or len(text.split()) < MIN_WORDS:
        return Verdict(False, math.inf, threshold, repeated, f"too short to judge ({len(text.split())} words)")
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    problems = []
    if loss > threshold:
        problems.append(f"judge loss {loss:.2f} > {threshold:.2f}")
    if repeated > MAX_REPEATED:
        problems.append(f"{repeated:.0%} of word bigrams repeat (> {MAX_REPEATED:.0%})")
    fluent = not problems
    reason = f"judge: fluent (loss {loss:.2f} <= {threshold:.2f}, {repeated:.0%} repeated bigrams)" if fluent else "judge: not fluent: " + "; ".join(problems)
    return Verdict(fluent, loss, threshold, repeated, reason)
