"""The MQAR generator and scorer: answers re-derived independently, oracle and random baselines."""

from __future__ import annotations

import math

import pytest
import torch

from assay.core.errors import AssayError
from assay.recall.mqar import IGNORE_INDEX, MQARBatches, MQARSpec, check_fits, evaluate, make_batch, score_predictions

SPEC = MQARSpec(n_keys=64, n_values=64)


def _answers_by_reading(spec: MQARSpec, inputs: list[int], pairs: int) -> dict[int, int]:
    """Position -> expected value, from the tokens alone: the first `pairs` key-value pairs go into a dict;
    later, every key token is a query whose answer is the dict's value (independent of the generator's code)."""
    table = {}
    answers = {}
    for position, token in enumerate(inputs):
        if position < 2 * pairs:
            if position % 2 == 0:
                assert spec.is_key(token), f"position {position} of the pair block holds {token}, not a key"
                table[token] = inputs[position + 1]
        elif spec.is_key(token):
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
        assert all(row_inputs[p + 1] == v for p, v in labelled.items())  # the answer follows its query in the input
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
        # Reads the answers from the tokens (the value that follows each query), not from the labels.
        predicted = torch.zeros_like(inputs)
        predicted[:, :-1] = inputs[:, 1:]
        return predicted

    score = evaluate(oracle, SPEC, 128, 16, examples=50, seed=0)
    assert score.total == 50 * 16
    assert score.accuracy == 1.0


def test_uniform_random_predictor_scores_near_chance():
    spec = MQARSpec(n_keys=64, n_values=16)  # chance 1/16 = 6.25%
    generator = torch.Generator().manual_seed(0)

    def uniform(inputs):
        return spec.first_value + torch.randint(0, spec.n_values, inputs.shape, generator=generator)

    score = evaluate(uniform, spec, 128, 16, examples=200, seed=0)
    # 3,200 answers: binomial standard deviation sqrt(p(1-p)/n) = 0.43 points; 4 of them is the tolerance.
    sigma = math.sqrt(spec.chance * (1 - spec.chance) / score.total)
    assert abs(score.accuracy - spec.chance) < 4 * sigma


def test_score_counts_only_answer_positions():
    labels = torch.full((1, 6), IGNORE_INDEX)
    labels[0, 2] = 300
    predicted = torch.tensor([[1, 2, 300, 4, 5, 6]])
    assert score_predictions(predicted, labels).accuracy == 1.0
    predicted[0, 2] = 301
    assert score_predictions(predicted, labels).accuracy == 0.0
