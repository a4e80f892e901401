"""Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology"): the generator and the scorer.

A sequence of `seq_len` tokens:
    k1 v1 k2 v2 ... kN vN | f f k3 f f k1 f f f f k2 f ... f
     N key-value pairs      a query region: every key asked once, in a random order, at random
                            two-token slots among filler tokens; the slot's second token is filler
The model reads the sequence left to right; at a query key it must predict the value that key was
paired with. As in Zoology, an answer never appears in the input after its query: when it did (this
generator before issue 19), the values already shown in the query region told a model which values
were left, and "a prefix value not yet shown" scores 1/N + 1/(N-1) + ... + 1 over N queries (52% at
4 pairs, 21% at 16) with no key matched: attention trained on that layout settled exactly there. Labels are IGNORE_INDEX (-100) everywhere except those answer positions, so loss and
accuracy count only recall, never the filler or the pairs' own values (unpredictable by design).

Token ranges are disjoint slices of the model's vocabulary, above the tokenizer's special tokens:
keys, values, filler. Keys are drawn without replacement per sequence (each key has one value);
values with replacement (as in Zoology). Chance for a predictor that knows only "some value comes
next" is 1 / n_values.

Everything is a pure function of (layout, seq_len, pairs, seed, index): a batch is reproducible from
its step number, which the trainer's resume contract needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from assay.core.errors import AssayError
from assay.recall.shapes import MQARLayout

IGNORE_INDEX = -100  # the trainer's (assay.train.data.IGNORE_INDEX); repeated so this module imports no trainer


def check_fits(layout: MQARLayout, seq_len: int, pairs: int) -> str | None:
    """Why (seq_len, pairs) is not a valid MQAR setting, or None. Zoology's rule: the pairs and the
    query region each take 2 x pairs tokens, so seq_len >= 4 x pairs."""
    if pairs < 1:
        return f"pairs must be >= 1 (got {pairs})"
    if pairs > layout.n_keys:
        return f"{pairs} pairs need {pairs} distinct keys; the layout has {layout.n_keys}"
    if seq_len < 4 * pairs:
        return f"{pairs} pairs need seq_len >= {4 * pairs} (pairs and queries take 2 x pairs tokens each)"
    return None


def make_sequence(layout: MQARLayout, seq_len: int, pairs: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One example: (inputs [seq_len], labels [seq_len]); labels[i] is the value to predict at a query key."""
    problem = check_fits(layout, seq_len, pairs)
    if problem:
        raise AssayError(problem)
    keys = layout.first_key + torch.randperm(layout.n_keys, generator=generator)[:pairs]
    values = layout.first_value + torch.randint(0, layout.n_values, (pairs,), generator=generator)
    inputs = layout.first_filler + torch.randint(0, layout.n_filler, (seq_len,), generator=generator)
    labels = torch.full((seq_len,), IGNORE_INDEX, dtype=torch.long)
    inputs[0 : 2 * pairs : 2] = keys
    inputs[1 : 2 * pairs : 2] = values
    # Query slots: two-token slots of the query region, chosen uniformly and kept in order; the slot's
    # second token stays filler (never the answer: see the module docstring).
    # (Zoology biases slots towards the start with a power law; uniform spreads the recall distance.)
    region_start = 2 * pairs
    n_slots = (seq_len - region_start) // 2
    slots = torch.randperm(n_slots, generator=generator)[:pairs].sort().values
    asked = torch.randperm(pairs, generator=generator)  # which pair each slot asks about
    positions = region_start + 2 * slots
    inputs[positions] = keys[asked]
    labels[positions] = values[asked]
    return inputs, labels


def make_batch(layout: MQARLayout, seq_len: int, pair_counts: list[int], seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """len(pair_counts) examples, row r with pair_counts[r] pairs; (inputs, labels), each [rows, seq_len]."""
    generator = torch.Generator().manual_seed(_mix(seed, index))
    rows = [make_sequence(layout, seq_len, pairs, generator) for pairs in pair_counts]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def _mix(seed: int, index: int) -> int:
    # Distinct generator seeds for (seed, index) pairs; the large odd multiplier keeps seeds 0 and 1 apart.
    return (seed * 1_000_003 + index * 7_919 + 12_345) % (2**63 - 1)


class MQARBatches:
    """The trainer's batch source (assay.train.data.BatchSource): step -> (inputs, labels), each [batch, seq_len].

    Each row's pair count is drawn from `pair_counts` (a mixture: one model learns every count, and is
    then scored per count), so a model is trained once per (architecture, seq_len), not once per cell.
    """

    def __init__(self, layout: MQARLayout, seq_len: int, batch: int, pair_counts: list[int], seed: int = 0):
        if not pair_counts:
            raise AssayError("MQAR training needs at least one pair count")
        for pairs in pair_counts:
            problem = check_fits(layout, seq_len, pairs)
            if problem:
                raise AssayError(problem)
        self.layout, self.seq_len, self.batch, self.pair_counts, self.seed = layout, seq_len, batch, list(pair_counts), seed

    def batch_for(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        chooser = torch.Generator().manual_seed(_mix(self.seed, -1 - step))
        picks = torch.randint(0, len(self.pair_counts), (self.batch,), generator=chooser).tolist()
        return make_batch(self.layout, self.seq_len, [self.pair_counts[i] for i in picks], self.seed, step)

    def tokens_consumed(self, step: int) -> int:
        return step * self.batch * self.seq_len


class ShortFirst:
    """A length curriculum as a batch source: `short` (sequences of fewer tokens, as many tokens per
    step) until `advance()`, then `main`. Recall needs a two-layer circuit (a previous-token head, then a
    head matching the query key against it); in short sequences each query is a larger share of the
    tokens and the circuit forms within a few hundred steps, and attention's relative positions carry it
    to the full length (docs/recall.md, "Short first"). `pair_counts` is the main stage's (the pair
    curriculum adds to it)."""

    def __init__(self, short: MQARBatches, main: MQARBatches):
        self.short, self.main = short, main
        self.current = short
        self.switched_at: int | None = None  # the step the main stage started at

    @property
    def pair_counts(self) -> list[int]:
        return self.main.pair_counts

    @pair_counts.setter
    def pair_counts(self, counts: list[int]) -> None:
        self.main.pair_counts = counts

    @property
    def on_short(self) -> bool:
        return self.current is self.short

    def advance(self, step: int) -> None:
        self.current, self.switched_at = self.main, step

    def batch_for(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.current.batch_for(step)

    def tokens_consumed(self, step: int) -> int:
        return step * self.main.batch * self.main.seq_len  # both stages take the same tokens per step


def short_pair_counts(layout: MQARLayout, short_len: int, pair_counts: list[int]) -> list[int]:
    """The pair counts a `short_len`-token stage trains: those of `pair_counts` that fit, else the most
    that fit (short_len // 4). AssayError if not even one pair fits."""
    fitting = [p for p in pair_counts if check_fits(layout, short_len, p) is None]
    if fitting:
        return fitting
    most = min(short_len // 4, layout.n_keys)
    if most < 1:
        raise AssayError(f"--short-first {short_len}: too short for one key-value pair (needs >= 4 tokens)")
    return [most]


# ---------------------------------------------------------------- scoring

# predict(inputs [B, T]) -> predicted token ids [B, T] (argmax of logits for a model)
Predictor = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Score:
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def score_predictions(predicted: torch.Tensor, labels: torch.Tensor) -> Score:
    """Exact-match count at the answer positions only. predicted, labels: [B, T]."""
    answered = labels != IGNORE_INDEX
    return Score(int((predicted[answered] == labels[answered]).sum()), int(answered.sum()))


def evaluate(predict: Predictor, layout: MQARLayout, seq_len: int, pairs: int, examples: int, seed: int, batch: int = 16) -> Score:
    """Accuracy of `predict` on `examples` fresh sequences with `pairs` pairs (seeded; the same set every call)."""
    correct = total = 0
    for start in range(0, examples, batch):
        rows = min(batch, examples - start)
        inputs, labels = make_batch(layout, seq_len, [pairs] * rows, seed, 1_000_000 + start)
        with torch.no_grad():
            predicted = predict(inputs)
        score = score_predictions(predicted, labels)
        correct, total = correct + score.correct, total + score.total
    return Score(correct, total)


def model_predictor(logits_fn: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str = "cpu") -> Predictor:
    """A Predictor from a logits function (tokens [B, T] -> logits [B, T, V]); predictions back on the CPU."""

    def predict(inputs: torch.Tensor) -> torch.Tensor:
        return logits_fn(inputs.to(device)).argmax(-1).cpu()

    return predict
