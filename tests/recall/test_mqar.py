"""The MQAR generator and scorer: answers re-derived independently, oracle and random baselines."""

from __future__ import annotations

import math

import pytest
import torch

from assay.core.errors import AssayError
from assay.recall.mqar import IGNORE_INDEX, MQARBatches, check_fits, evaluate, make_batch, score_predictions
from assay.recall.shapes import MQARLayout

SPEC = MQARLayout(n_keys=64, n_values=64)


def _answers_by_reading(layout: MQARLayout, inputs: list[int], pairs: int) -> dict[int, int]:
    """Position -> expected value, from the tokens alone: the first `pairs` key-value pairs go into a dict;
    later, every key token is a query whose answer is the dict's value (independent of the generator's code)."""
    table = {}
    answers = {}
    for position, token in enumerate(inputs):
        if position < 2 * pairs:
            if position % 2 == 0:
                assert layout.is_key(token), f"position {position} of the pair block holds {token}, not a key"
                table[token] = inputs[position + 1]
        elif layout.is_key(token):
            answers[position] = table[token]
    return answers


@pytest.mark.parametrize("pairs", [1, 4, 16])
def test_generator_labels_match_answers_read_back_from_the_tokens(pairs):
    inputs, labels = make_batch(SPEC, 64, [pairs] * 8, seed=3, index=0)
    for row_inputs, row_labels in zip(inputs.tolist(), labels.tolist()):
        expected = _answers_by_reading(SPEC, row_inputs, pairs)
        labelled = {p: v for p, v in enumerate(row_labels) if v != IGNORE_INDEX}
        assert labelled == expected
        assert len(labelled) == pairs  # every key is asked exactly once
        # No answer is ever in the input after the pair block (Zoology's layout: see test_answers_are_not_shown...).
        assert not any(SPEC.first_value <= t < SPEC.first_filler for t in row_inputs[2 * pairs :])
        keys = row_inputs[0 : 2 * pairs : 2]
        assert len(set(keys)) == pairs  # distinct keys: each has one value


def test_token_ranges_are_disjoint_and_inside_the_vocabulary():
    inputs, labels = make_batch(SPEC, 128, [16] * 4, seed=0, index=0)
    assert int(inputs.min()) >= SPEC.first_key and int(inputs.max()) < SPEC.vocab_size
    answered = labels[labels != IGNORE_INDEX]
    assert bool(((answered >= SPEC.first_value) & (answered < SPEC.first_filler)).all())


def test_generator_is_deterministic_per_seed_and_index():
    first = make_batch(SPEC, 64, [4, 8], seed=1, index=5)
    again = make_batch(SPEC, 64, [4, 8], seed=1, index=5)
    other_seed = make_batch(SPEC, 64, [4, 8], seed=2, index=5)
    other_index = make_batch(SPEC, 64, [4, 8], seed=1, index=6)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other_seed[0])
    assert not torch.equal(first[0], other_index[0])


def test_batch_source_mixes_pair_counts_and_repeats_a_step():
    source = MQARBatches(SPEC, 64, batch=32, pair_counts=[2, 8], seed=0)
    inputs, labels = source.batch_for(7)
    assert inputs.shape == labels.shape == (32, 64)
    answers_per_row = set((labels != IGNORE_INDEX).sum(dim=1).tolist())
    assert answers_per_row == {2, 8}
    assert torch.equal(source.batch_for(7)[0], inputs)
    assert source.tokens_consumed(3) == 3 * 32 * 64


def test_settings_that_do_not_fit_are_refused_with_the_reason():
    assert check_fits(SPEC, 64, 16) is None
    assert "seq_len >= 68" in check_fits(SPEC, 64, 17)
    assert "distinct keys" in check_fits(SPEC, 1024, 65)
    with pytest.raises(AssayError, match="seq_len >= 128"):
        MQARBatches(SPEC, 64, batch=4, pair_counts=[32])


def test_oracle_scores_100_percent():
    def oracle(inputs):
        # Reads the answers from the tokens (the pair block looked up by key), not from the labels.
        predicted = torch.zeros_like(inputs)
        for row, tokens in enumerate(inputs.tolist()):
            for position, value in _answers_by_reading(SPEC, tokens, 16).items():
                predicted[row, position] = value
        return predicted

    score = evaluate(oracle, SPEC, 128, 16, examples=50, seed=0)
    assert score.total == 50 * 16
    assert score.accuracy == 1.0


def test_uniform_random_predictor_scores_near_chance():
    layout = MQARLayout(n_keys=64, n_values=16)  # chance 1/16 = 6.25%
    generator = torch.Generator().manual_seed(0)

    def uniform(inputs):
        return layout.first_value + torch.randint(0, layout.n_values, inputs.shape, generator=generator)

    score = evaluate(uniform, layout, 128, 16, examples=200, seed=0)
    # 3,200 answers: binomial standard deviation sqrt(p(1-p)/n) = 0.43 points; 4 of them is the tolerance.
    sigma = math.sqrt(layout.chance * (1 - layout.chance) / score.total)
    assert abs(score.accuracy - layout.chance) < 4 * sigma


def test_score_counts_only_answer_positions():
    labels = torch.full((1, 6), IGNORE_INDEX)
    labels[0, 2] = 300
    predicted = torch.tensor([[1, 2, 300, 4, 5, 6]])
    assert score_predictions(predicted, labels).accuracy == 1.0
    predicted[0, 2] = 301
    assert score_predictions(predicted, labels).accuracy == 0.0


def _eliminating_predictor(layout: MQARLayout, pairs: int, seed: int):
    """Matches no key: at a query it guesses among the pair block's values not yet seen after the block.
    Any model that can tell "a value" from "a value already shown" can do this; it needs no recall."""
    generator = torch.Generator().manual_seed(seed)

    def predict(inputs: torch.Tensor) -> torch.Tensor:
        predicted = torch.zeros_like(inputs)
        for row, tokens in enumerate(inputs.tolist()):
            left = tokens[1 : 2 * pairs : 2]
            for position in range(2 * pairs, len(tokens)):
                if tokens[position] in left:  # a value shown in the query region is no longer a candidate
                    left.remove(tokens[position])
                if layout.is_key(tokens[position]) and left:
                    predicted[row, position] = left[int(torch.randint(0, len(left), (1,), generator=generator))]
        return predicted

    return predict


def _with_answers_shown(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout before issue 19: each query slot's second token was the answer itself."""
    inputs, labels = batch[0].clone(), batch[1]
    rows, positions = (labels != IGNORE_INDEX).nonzero(as_tuple=True)
    inputs[rows, positions + 1] = labels[rows, positions]
    return inputs, labels


@pytest.mark.parametrize("pairs", [4, 16])
def test_answers_are_not_shown_so_elimination_scores_only_the_copy_rate(pairs):
    # Why attention sat at 52% / 23% (issue 19): with every answer shown after its query, elimination (no
    # key matched) scores the harmonic mean H(N) / N: 52.1% at 4 pairs, 21.1% at 16. A quiet 10-CPU-minute
    # Qwen3 run on that layout scored 25 / 31 / 50 / 99% on the 1st..4th query of 4: elimination exactly.
    # Without the shown answers, elimination is a copy of any pair-block value: 1 / N.
    examples = 300
    expected_leak = sum(1 / k for k in range(1, pairs + 1)) / pairs
    batch = make_batch(SPEC, 64, [pairs] * examples, seed=5, index=0)
    leaky_inputs, labels = _with_answers_shown(batch)
    leaky = score_predictions(_eliminating_predictor(SPEC, pairs, 0)(leaky_inputs), labels)
    clean = score_predictions(_eliminating_predictor(SPEC, pairs, 0)(batch[0]), labels)
    # Binomial standard deviation at 1,200 (4 pairs) or 4,800 (16) answers is at most 1.5 points; 4 of them
    # is the tolerance. (Values are drawn with replacement, so a repeated value adds a little to both.)
    sigma = math.sqrt(0.25 / leaky.total)
    assert abs(leaky.accuracy - expected_leak) < 4 * sigma + 0.02
    assert abs(clean.accuracy - 1 / pairs) < 4 * sigma + 0.02
    assert leaky.accuracy > clean.accuracy + 0.1
