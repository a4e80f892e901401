"""Batched, chunked prefill in the engine (serve/engine/scheduler.py plans it, serve/engine/engine.py runs it): prompts of different lengths prefilled in
one right-padded call, a prompt longer than max_prefill_tokens chunked over steps while running sequences
keep decoding, echo's prompt log-probabilities across chunks, n > 1 and aborts mid-prefill.

Models: tiny Qwen3, Gemma 3 (a sliding-window layer of 8 with prompts past it) and GLA with and without
short convolutions, built with a wide init (std 0.1: logits far from uniform, so a leaked pad or a wrong
chunk start shows). Eager, float32. Greedy tokens are compared exactly; log-probabilities with
("model_logits", float32) = 1e-5 for the KV-cache models (the same math over a padded batch, summation order
aside) and ("recurrence", float32) = 1e-4 for the GLA (the chunked form over a different chunking).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models import registry
from assay.serve import Engine, EngineConfig, run_to_completion
from assay.serve.engine.scheduler import plan_chunks, short_first

# Lengths padded to 40 stay within the padding cap, so one call takes them all; most pass Gemma 3's window of 8.
LENGTHS = [40, 9, 33, 26, 38]
NEW = 6
MODELS = ["qwen3", "gemma3", "gla", "gla_conv"]


def _slot_model(name: str):
    spec = registry.get("gla" if name == "gla_conv" else name)
    args = replace(spec.flavours["tiny"], max_seq_len=128, **({"use_short_conv": True} if name == "gla_conv" else {}))
    model = spec.build(args, "cpu", torch.float32, seed=0)
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    return spec.wrap_slot_model(model.eval(), args)


@pytest.fixture(scope="module", params=MODELS)
def slot_model(request):
    return _slot_model(request.param)


def _check(slot_model) -> str:
    return "model_logits" if slot_model.uses_max_len() else "recurrence"


def _prompts(vocab_size: int, lengths=LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def _engine(slot_model, **overrides) -> Engine:
    config = {"max_seqs": 8, "buckets": (1, 2, 4, 8), "eager": True, "max_len": 64} | overrides
    return Engine(slot_model, EngineConfig(**config))


def _run(engine: Engine, prompts: list[list[int]], **request) -> tuple[dict[str, list[int]], dict[str, object]]:
    """Every request's tokens, and its first event (first token's log-probabilities, echo's prompt entries)."""
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, max_tokens=NEW, **request)
    tokens: dict[str, list[int]] = {}
    first: dict[str, object] = {}
    while engine.has_unfinished():
        for event in engine.step():
            first.setdefault(event.request_id, event)
            tokens.setdefault(event.request_id, []).append(event.token_id)
    return tokens, first


def _alone(slot_model, prompts, **request):
    """Each prompt through its own engine: one prompt per prefill call, no chunks."""
    tokens, first = {}, {}
    for index, prompt in enumerate(prompts):
        got, events = _run(_engine(slot_model, max_seqs=1, buckets=(1,), max_prefill_tokens=None), [prompt], **request)
        tokens[f"r{index}"], first[f"r{index}"] = got["r0"], events["r0"]
    return tokens, first


def _assert_same_logprobs(check, got, want) -> None:
    """Two TokenLogprob entries: the same token and top ids, log-probabilities within the tolerance."""
    assert got.token_id == want.token_id and [t for t, _ in got.top] == [t for t, _ in want.top]
    assert_close(check, torch.tensor([got.logprob, *(v for _, v in got.top)]), torch.tensor([want.logprob, *(v for _, v in want.top)]), torch.float32)


@pytest.mark.parametrize("budget", [256, 16])
def test_a_batched_or_chunked_prefill_gives_each_prompt_what_it_gets_alone(slot_model, budget):
    prompts = _prompts(slot_model.args.vocab_size)
    expected, expected_first = _alone(slot_model, prompts, logprobs=5)
    engine = _engine(slot_model, max_prefill_tokens=budget)
    tokens, first = _run(engine, prompts, logprobs=5)
    stats = engine.stats().as_dict()
    assert tokens == expected
    for request_id, event in first.items():
        _assert_same_logprobs(_check(slot_model), event.logprob, expected_first[request_id].logprob)
    assert stats["prefills"] == len(prompts) and stats["prefill_tokens"] == sum(LENGTHS)
    if budget == 256:  # every prompt in one call of 5 rows x 40: padded, not one call per prompt
        assert stats["prefill_calls"] == 1 and stats["prefill_padding_fraction"] == pytest.approx(1 - sum(LENGTHS) / (5 * 40))
    else:  # chunks of at most 16 tokens, rows x width <= 16 per call: later chunks continue from the slot
        assert stats["prefill_calls"] >= sum(LENGTHS) // 16 + 1


def test_a_long_prompt_is_chunked_while_running_sequences_get_a_token_every_step():
    slot_model = _slot_model("qwen3")
    engine = _engine(slot_model, max_prefill_tokens=16, max_len=96)
    short, long = _prompts(slot_model.args.vocab_size, [4, 5]), _prompts(slot_model.args.vocab_size, [50])[0]
    for index, prompt in enumerate(short):
        engine.add_request(f"s{index}", prompt, max_tokens=30)
    engine.step()  # both prefilled together (9 tokens) and decoding
    engine.add_request("long", long, max_tokens=3)
    calls = engine.stats().prefill_calls
    steps = 0
    long_tokens: list[int] = []
    while not long_tokens:
        events = engine.step()
        steps += 1
        by_id = {e.request_id for e in events}
        assert by_id >= {"s0", "s1"}, f"step {steps}: a running sequence got no token while the long prompt prefilled"
        long_tokens = [e.token_id for e in events if e.request_id == "long"]
        if not long_tokens:
            assert engine.totals().running == 3 and engine.num_running == 2, "the prompt being prefilled holds its slot"
    assert steps == 4, "50 tokens at 16 a step: 16 + 16 + 16 + 2"
    assert engine.stats().prefill_calls - calls == 4, "one prefill call per step"
    long_tokens += run_to_completion(engine).get("long", [])
    assert long_tokens == _alone(slot_model, [long])[0]["r0"][:3]


def test_echo_prompt_logprobs_over_a_chunked_prompt_equal_the_unchunked_ones(slot_model):
    prompts = _prompts(slot_model.args.vocab_size, [37, 12])
    _, whole = _alone(slot_model, prompts, prompt_logprobs=3)
    engine = _engine(slot_model, max_prefill_tokens=8)
    _, chunked = _run(engine, prompts, prompt_logprobs=3)
    assert engine.stats().prefill_calls >= 37 // 8 + 1
    for request_id, event in chunked.items():
        entries, reference = event.prompt_logprobs, whole[request_id].prompt_logprobs
        assert len(entries) == len(reference) == len(prompts[int(request_id[1:])])
        assert entries[0].logprob is None and reference[0].logprob is None
        for got, want in zip(entries[1:], reference[1:]):
            _assert_same_logprobs(_check(slot_model), got, want)


def test_n_choices_with_a_chunked_prefill_copy_the_whole_prompt_state():
    slot_model = _slot_model("gla_conv")
    prompt = _prompts(slot_model.args.vocab_size, [30])
    request = {"n": 3, "temperature": 1.0, "seed": 11}
    engine = _engine(slot_model, max_prefill_tokens=8)
    tokens, _ = _run(engine, prompt, **request)
    expected, _ = _run(_engine(slot_model, max_prefill_tokens=None), prompt, **request)
    assert engine.stats().prefill_calls == 4 and engine.stats().prefills == 1, "prefilled once, in chunks of 8"
    assert sorted(tokens) == ["r0", "r0/1", "r0/2"] and tokens == expected
    assert len({tuple(t) for t in tokens.values()}) > 1, "the choices sample apart"
    assert engine.free_slots == 8


def test_an_abort_during_a_chunked_prefill_frees_the_slot_and_a_choice_left_takes_over():
    slot_model = _slot_model("gemma3")
    prompt = _prompts(slot_model.args.vocab_size, [40])[0]
    engine = _engine(slot_model, max_prefill_tokens=8)
    engine.add_request("pair", prompt, max_tokens=4, n=2)
    engine.step()  # 8 of 40 tokens in choice 0's slot; choice 1's slot waits for the copy
    assert engine.free_slots == 6 and engine.totals().running == 2 and engine.num_running == 0
    engine.abort("pair")  # pair/1 takes over the partial prefill (copied into its slot)
    events = engine.step()
    assert [(e.request_id, e.finish_reason) for e in events] == [("pair", "abort")] and engine.free_slots == 7
    tokens = run_to_completion(engine)
    assert tokens["pair/1"] == _run(_engine(slot_model), [prompt])[0]["r0"][:4]
    assert engine.stats().prefill_calls == 5, "40 tokens in chunks of 8, the hand-over lost none"

    engine.add_request("gone", prompt, max_tokens=4)
    engine.step()
    assert engine.free_slots == 7 and engine.num_waiting == 0
    engine.abort("gone")
    events = engine.step()
    assert [(e.request_id, e.finish_reason, e.token_id) for e in events] == [("gone", "abort", -1)]
    assert engine.free_slots == 8 and not engine.has_unfinished() and engine.totals().running == 0
    assert engine.stats().as_dict()["finished"] == {"abort": 2, "length": 1}


def test_plan_chunks_keeps_the_budget_and_the_padding_cap():
    assert plan_chunks([128] * 6, 512) == [128] * 4 + [0, 0]
    assert plan_chunks([2000, 10], 512) == [512, 0], "the oldest takes the whole budget"
    assert plan_chunks([100, 500, 10], 512) == [100, 256, 0], "a long one joins with what the budget leaves per row"
    assert plan_chunks([5, 3, 7, 1], None) == [5, 3, 7, 1]
    # 4 rows x 60 = 240 padded against 63 real tokens: past the cap, so the 60-token prompt waits, not the next
    assert plan_chunks([1, 1, 1, 60, 2], None, 2.0) == [1, 1, 1, 0, 2]
    assert plan_chunks([10, 500, 10], 512, 1.5) == [10, 0, 10], "2 x 256 padded for 266 real: past 1.5x"


def test_short_prompts_are_offered_the_budget_before_one_long_prompt():
    assert short_first([2000, 100, 30], 512) == [1, 2, 0], "short ones first, oldest first; then the long one"
    assert short_first([2000, 3000, 100], 512) == [2, 0], "one long prompt at a time: the oldest"
    assert short_first([2000, 100], 0) == [0, 1] and short_first([2000, 100], None) == [0, 1], "off: first come, first served"
    # The long one was offered last step: it sits this one out while short ones wait, never two steps in a row.
    assert short_first([2000, 100, 30], 512, long_waited=False) == [1, 2]
    assert short_first([2000], 512, long_waited=False) == [0], "alone, the long one always goes"


def test_a_long_prompt_sits_out_the_short_prompts_steps_but_never_two_in_a_row():
    # Sustained short traffic: a new 6-token prompt before every step, a 50-token prompt at 16 tokens a step.
    slot_model = _slot_model("qwen3")
    engine = _engine(slot_model, max_prefill_tokens=16, max_len=96, long_prefill_token_threshold=16)
    long = _prompts(slot_model.args.vocab_size, [50])[0]
    engine.add_request("long", long, max_tokens=1)
    engine.step()  # the long prompt's first 16 tokens
    progress, late, step = [], [], 0
    while "long" in engine._prefilling:
        step += 1
        engine.add_request(f"short-{step}", _prompts(slot_model.args.vocab_size, [6])[0], max_tokens=1)
        done_before = engine._prefilling["long"].done
        firsts = {event.request_id for event in engine.step()}
        job = engine._prefilling.get("long")
        progress.append(job is None or job.done > done_before)
        late += [] if f"short-{step}" in firsts else [step]
        if not progress[-1]:
            assert firsts == {f"short-{step}"}, "the step the long one sat out was the short one's alone"
    assert late == [], "every short prompt had its first token in the step after it arrived"
    assert all(progress[i] or progress[i + 1] for i in range(len(progress) - 1)), progress
    assert progress.count(False) >= 1, "it did sit out a short prompt's step"


@pytest.mark.parametrize("threshold", [16, 0])
def test_a_short_prompt_arriving_mid_prefill_gets_its_first_token_before_the_long_one_is_prefilled(threshold):
    # The long prompt (50 tokens at a budget of 16 a step) is part-way when the short one (6 tokens) arrives.
    # Threshold 16: the short one goes ahead in the next step's call, the long one takes the rest of the budget
    # (16 // 2 = 8) and still moves. Threshold 0 (first come, first served): the short one waits for the long
    # one's chunks and joins only its last call (2 tokens left: room for 6 more).
    slot_model = _slot_model("qwen3")
    engine = _engine(slot_model, max_prefill_tokens=16, max_len=96, long_prefill_token_threshold=threshold)
    long, short = _prompts(slot_model.args.vocab_size, [50, 6])
    engine.add_request("long", long, max_tokens=3)
    engine.step()  # the long prompt's first 16 tokens
    engine.add_request("short", short, max_tokens=3)
    first_token_step: dict[str, int] = {}
    tokens: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for event in engine.step():
            first_token_step.setdefault(event.request_id, step)
            tokens.setdefault(event.request_id, []).append(event.token_id)
    if threshold:
        assert first_token_step["short"] == 1 and first_token_step["long"] > first_token_step["short"]
    else:
        assert first_token_step["short"] == first_token_step["long"] == 3, "50 tokens at 16 a step: 16 + 16 + 16 + 2"
    # Either order, each prompt's tokens are those it gets alone.
    assert tokens == {"long": _alone(slot_model, [long])[0]["r0"][:3], "short": _alone(slot_model, [short])[0]["r0"][:3]}


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_chunks_past_the_live_grain_read_only_the_positions_in_use_and_give_the_tokens_of_one_pass(name):
    # A 200-token prompt in chunks of 48 into slots of 320: the first chunks see a view of 128 positions, the
    # later ones 256 (LIVE_GRAIN), never the whole slot; Gemma 3's window-8 layers keep their ring as it is.
    # Greedy tokens and the first token's log-probabilities equal one unchunked pass over the whole slot.
    spec = registry.get(name)
    args = replace(spec.flavours["tiny"], max_seq_len=320)
    model = spec.build(args, "cpu", torch.float32, seed=0)
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    slot_model = spec.wrap_slot_model(model.eval(), args)
    prompts = _prompts(args.vocab_size, [200, 7])
    chunked_engine = Engine(slot_model, EngineConfig(max_seqs=2, buckets=(1, 2), eager=True, max_len=320, max_prefill_tokens=48))
    chunked, first = _run(chunked_engine, prompts, logprobs=5)
    assert chunked_engine.stats().prefill_calls >= 200 // 48 + 1
    whole_engine = Engine(slot_model, EngineConfig(max_seqs=1, buckets=(1,), eager=True, max_len=320, max_prefill_tokens=None))
    for index, prompt in enumerate(prompts):
        tokens, events = _run(whole_engine, [prompt], logprobs=5)
        assert chunked[f"r{index}"] == tokens["r0"]
        _assert_same_logprobs("model_logits", first[f"r{index}"].logprob, events["r0"].logprob)
