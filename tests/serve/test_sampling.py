"""Sampling as clients ask for it (temperature, top_k, top_p, seed, n), log-probabilities, and the pool copy
behind n > 1, checked against what each setting means on a small known distribution."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from assay.core.errors import AssayError
from assay.serve import Engine, EngineConfig, SlotPool, run_to_completion
from assay.serve.engine.sampling import Sampling, prompt_logprobs, sample_tokens, token_logprobs

# Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (and tokens 5..7 almost never): top_k and top_p cut known sets.
PROBS = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05, 1e-9, 1e-9, 1e-9], dtype=torch.float64)
LOGITS = PROBS.log().float()


def frequencies(sampling: Sampling, draws: int = 4000) -> dict[int, float]:
    counts = Counter(sampling.draw(LOGITS.clone()) for _ in range(draws))
    return {token: count / draws for token, count in counts.items()}


def expected(kept: list[int], temperature: float = 1.0) -> dict[int, float]:
    weights = PROBS[kept] ** (1 / temperature)
    return dict(zip(kept, (weights / weights.sum()).tolist()))


def close(freq: dict[int, float], want: dict[int, float]) -> bool:
    # 4000 draws: a frequency's standard deviation is at most 0.008; 0.035 is over four of them.
    return set(freq) <= set(want) and all(abs(freq.get(t, 0.0) - p) < 0.035 for t, p in want.items())


@pytest.mark.parametrize(
    "settings, kept",
    [
        ({}, [0, 1, 2, 3, 4]),
        ({"top_k": 2}, [0, 1]),
        ({"top_p": 0.7}, [0, 1]),  # 0.4 + 0.3 reaches 0.7: the nucleus is the first two
        ({"top_p": 0.71}, [0, 1, 2]),
        ({"top_k": 3, "top_p": 0.5}, [0, 1]),
    ],
    ids=["plain", "top-k-2", "top-p-0.7", "top-p-0.71", "top-k-then-top-p"],
)
def test_draws_follow_the_distribution_left_by_top_k_then_top_p(settings, kept):
    freq = frequencies(Sampling.create(temperature=1.0, seed=0, **settings))
    assert close(freq, expected(kept)), (freq, expected(kept))


def test_temperature_is_applied_before_top_p():
    # At temperature 0.5 the probabilities become 0.4^2 : 0.3^2 : ... = 0.55, 0.31, 0.08, ...: a top_p of 0.8
    # keeps two tokens; on the untempered distribution it would keep three (0.4 + 0.3 < 0.8).
    freq = frequencies(Sampling.create(temperature=0.5, top_p=0.8, seed=1))
    assert close(freq, expected([0, 1], temperature=0.5)), freq


def test_greedy_ignores_top_k_and_top_p_and_a_seed_repeats_its_draws():
    assert sample_tokens(LOGITS[None], [Sampling.create(0.0, top_k=3, top_p=0.5)]) == [0]
    a, b = Sampling.create(1.0, seed=7), Sampling.create(1.0, seed=7)
    assert [a.draw(LOGITS) for _ in range(50)] == [b.draw(LOGITS) for _ in range(50)]


@pytest.mark.parametrize("settings", [{"top_p": 5e-324}, {"temperature": 5e-324}, {"temperature": 1e-6, "top_p": 1e-30}],
                         ids=["subnormal-top-p", "subnormal-temperature", "both-tiny"])
def test_extreme_settings_draw_the_most_likely_token_instead_of_failing(settings):
    # Found by the property-based test of the server: top_p 5e-324 is 0 in float32 and emptied the nucleus,
    # and a temperature that small turns the logits into infinities; either made the draw raise.
    sampling = Sampling.create(**({"temperature": 1.0, "seed": 0} | settings))
    assert [sample_tokens(LOGITS[None], [sampling]) for _ in range(20)] == [[0]] * 20


def test_choice_j_of_n_draws_as_seed_plus_j():
    base = Sampling.create(1.0, seed=41)
    fork = base.fork(2)
    alone = Sampling.create(1.0, seed=43)
    assert [fork.draw(LOGITS) for _ in range(40)] == [alone.draw(LOGITS) for _ in range(40)]
    assert Sampling.create(1.0, seed=2**64 - 1).fork(1).generator.initial_seed() == 0  # wraps modulo 2**64


@pytest.mark.parametrize("settings, message", [({"top_p": 0.0}, "top_p must be in (0, 1]"), ({"top_k": -2}, "top_k must be"),
                                               ({"seed": 2**64}, "seed must be in"), ({"logprobs": -1}, "logprobs must be")])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(AssayError, match=message.replace("(", r"\(").replace("]", r"\]")):
        Sampling.create(1.0, **settings)


def test_logprobs_are_the_float32_log_softmax_of_the_logits_with_the_top_k():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = [Sampling.create(0.0, logprobs=2), Sampling.create(0.0), Sampling.create(0.0, logprobs=0)]
    tokens = [4, 5, 6]
    entries = token_logprobs(logits, tokens, rows)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert entries[1] is None and entries[2].top == ()
    assert math.isclose(entries[0].logprob, reference[0, 4].item(), rel_tol=1e-6)
    assert [t for t, _ in entries[0].top] == torch.topk(reference[0], 2).indices.tolist()
    # A prompt's: position t from the logits at t - 1, the first without a value, across chunk boundaries.
    prompt = torch.randint(0, 50, (600,), generator=torch.Generator().manual_seed(1)).tolist()
    all_logits = torch.randn(600, 50, generator=torch.Generator().manual_seed(2))
    got = prompt_logprobs(all_logits, prompt, 1)
    want = torch.log_softmax(all_logits.double(), dim=-1)
    assert got[0].logprob is None and len(got) == 600
    assert max(abs(got[t].logprob - want[t - 1, prompt[t]].item()) for t in range(1, 600)) < 1e-5


@pytest.mark.parametrize("model", ["gla", "qwen3-pretrained"], ids=["fixed-state", "kv-cache"])
def test_n_copies_of_a_prefilled_slot_decode_as_the_prompt_alone_and_touch_no_other_slot(zoo_dir, model):
    engine = Engine.from_checkpoint(zoo_dir / model, EngineConfig(max_seqs=5, eager=True, max_len=64))
    used = {0, 1, 2}  # the lowest slot ids are handed out first
    for buffer in engine.pool.buffers:
        buffer[3:5] = float("nan")  # a slot the copy wrote by mistake would not stay NaN
    engine.add_request("r", [5, 6, 7, 8], max_tokens=6, n=3)
    tokens = run_to_completion(engine)
    assert sorted(tokens) == ["r", "r/1", "r/2"]
    alone = Engine.from_checkpoint(zoo_dir / model, EngineConfig(max_seqs=1, eager=True, max_len=64))
    alone.add_request("a", [5, 6, 7, 8], max_tokens=6)
    want = run_to_completion(alone)["a"]
    assert tokens["r"] == tokens["r/1"] == tokens["r/2"] == want
    for buffer in engine.pool.buffers:
        for slot in set(range(engine.pool.max_seqs)) - used:
            assert torch.isnan(buffer[slot]).all()
    assert engine.free_slots == 5


def test_copy_slot_copies_every_buffer_row(zoo_dir):
    buffers = [torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3), torch.zeros(4, 2, 2)]
    pool = SlotPool(buffers, max_seqs=3)
    buffers[1][1] = 7.0
    pool.copy_slot(1, [0, 2])
    assert buffers[0][0].tolist() == buffers[0][1].tolist() == buffers[0][2].tolist() == [3.0, 4.0, 5.0]
    assert (buffers[1][:3] == 7.0).all() and (buffers[1][3] == 0).all()  # the scratch row is untouched


def test_a_waiting_request_with_n_choices_needs_n_free_slots_and_its_choices_abort_one_by_one(zoo_dir):
    engine = Engine.from_checkpoint(zoo_dir / "gla", EngineConfig(max_seqs=2, eager=True))
    engine.add_request("long", [5, 6], max_tokens=50)
    engine.step()  # "long" takes a slot; one is free
    engine.add_request("pair", [7, 8], max_tokens=3, n=2)
    for _ in range(3):
        engine.step()
        assert engine.num_waiting == 1  # two choices wait for two free slots
    engine.abort("pair/1")
    events = engine.step()  # the second choice leaves the queue; the first now fits and is admitted
    assert [(e.request_id, e.finish_reason) for e in events if e.finished] == [("pair/1", "abort")]
    assert any(e.request_id == "pair" for e in events) and engine.num_waiting == 0
    tokens = run_to_completion(engine)
    first = [e.token_id for e in events if e.request_id == "pair"]
    assert len(first + tokens.get("pair", [])) == 3 and engine.free_slots == 2 and not engine.has_unfinished()
