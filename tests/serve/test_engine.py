"""The engine on the tiny zoo GLA (and Qwen3): continuous batching, padding, compiles, aborts, accounting.

Eager or aot_eager everywhere except one inductor test (compiled vs eager logits).
"""

from __future__ import annotations

import math

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import rel_error, tolerance
from assay.serve import Engine, EngineConfig, QueueFull, run_to_completion
from assay.models.slots import StateSlotModel
from assay.serve.runner.weights import load_slot_model

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [100, 200, 300, 400, 500, 600, 700], [42], [17, 18, 19, 20, 21, 22], [900, 3]]


@pytest.fixture(scope="module")
def gla(zoo_dir) -> StateSlotModel:
    return load_slot_model(zoo_dir / "gla", torch.device("cpu"), 64)


def _engine(slot_model, zoo_dir=None, **overrides) -> Engine:
    config = EngineConfig(**({"max_seqs": 4, "buckets": (1, 2, 4), "backend": "aot_eager"} | overrides))
    return Engine(slot_model, config, tokenizer_dir=None if zoo_dir is None else zoo_dir / "gla")


def _alone(model, prompt: list[int], n: int) -> list[int]:
    """What the sequence gets decoded alone: the model's own greedy generate (prefill, then decode_step)."""
    return model.generate(torch.tensor([prompt]), n)[0, len(prompt):].tolist()


@pytest.mark.slow
def test_continuous_batching_gives_each_sequence_the_tokens_it_gets_alone(gla):
    # Requests join while others run (staggered over steps) and leave at different lengths; float32 eager:
    # every row of a padded batch is computed independently, so the tokens must be equal, not close.
    engine = _engine(gla, eager=True)
    tokens: dict[str, list[int]] = {}
    schedule = {0: [0, 1], 2: [2], 3: [3, 4], 7: [5]}
    step = 0
    while step <= max(schedule) or engine.has_unfinished():
        for index in schedule.get(step, []):
            engine.add_request(f"r{index}", PROMPTS[index], max_tokens=4 + 2 * index)
        for event in engine.step():
            tokens.setdefault(event.request_id, []).append(event.token_id)
        step += 1
    assert engine.stats().as_dict()["widths"].keys() >= {"4"}, "the run never padded: the test does not test padding"
    for index, prompt in enumerate(PROMPTS):
        assert tokens[f"r{index}"] == _alone(gla.model, prompt, 4 + 2 * index), f"request r{index}"
    assert engine.free_slots == 4


def test_padding_rows_never_touch_a_free_slot(gla):
    # Fill every free slot with NaN: a padding row that read or wrote one would turn it (or a token) to NaN.
    engine = _engine(gla, max_seqs=8, buckets=(1, 2, 4, 8), eager=True)
    for buffer in engine.pool.buffers:
        buffer[: engine.pool.max_seqs].fill_(math.nan)
    for index in range(3):  # 3 running -> width 4: one padding row each step
        engine.add_request(f"r{index}", PROMPTS[index], max_tokens=5)
    widths = set()
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for event in engine.step():
            tokens.setdefault(event.request_id, []).append(event.token_id)
        used = engine.pool.used_slots()
        for buffer in engine.pool.buffers:
            for slot in range(engine.pool.max_seqs):
                if slot in used:
                    assert torch.isfinite(buffer[slot]).all()
                elif slot >= 3:  # never allocated in this run
                    assert torch.isnan(buffer[slot]).all(), f"slot {slot} was touched"
        widths |= set(engine.stats().as_dict()["widths"])
    assert "4" in widths
    for index in range(3):
        assert tokens[f"r{index}"] == _alone(gla.model, PROMPTS[index], 5)
    assert engine.free_slots == 8 and engine.pool.num_used == 0


@pytest.mark.slow
def test_buckets_compile_every_width_at_warm_up_and_never_while_serving(gla):
    engine = _engine(gla, max_seqs=4, buckets=(1, 2, 4))
    engine.warm_up()
    warm = engine.stats().as_dict()
    assert warm["warmup_widths"] == [1, 2, 4] and warm["warmup_compiles"] == 3
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{index}", prompt, max_tokens=3 + index)
    tokens = run_to_completion(engine)
    stats = engine.stats().as_dict()
    assert stats["compiles"] == 0 and stats["compiled_steps"] == [] and stats["compile_share"] == 0.0
    assert set(stats["widths"]) <= {"1", "2", "4"} and stats["decode_steps"] > 0
    assert all(tokens[f"r{i}"] == _alone(gla.model, p, 3 + i) for i, p in enumerate(PROMPTS))


def test_no_buckets_compiles_each_new_width_during_decode_and_says_which_steps(gla):
    engine = _engine(gla, max_seqs=4, buckets=None)
    engine.warm_up()  # a no-op: nothing is known in advance
    assert engine.stats().as_dict()["warmup_compiles"] == 0
    for index, prompt in enumerate(PROMPTS[:4]):
        engine.add_request(f"r{index}", prompt, max_tokens=2 + 2 * index)  # they leave one by one: widths 4, 3, 2, 1
    run_to_completion(engine)
    stats = engine.stats().as_dict()
    compiled_widths = [step["width"] for step in stats["compiled_steps"]]
    assert sorted(compiled_widths) == [1, 2, 3, 4], "each width compiles once, the first time it is seen"
    assert stats["compiles"] == 4 and 0 < stats["compile_share"] <= 1
    assert all(step["compiled"] and step["step_s"] >= step["compile_s"] > 0 for step in stats["compiled_steps"])
    # The steps that compiled are the first step at each width: later steps at that width did not.
    first_step_at = {}
    for record in engine.stats().steps:
        first_step_at.setdefault(record.width, record.step)
    assert sorted(step["step"] for step in stats["compiled_steps"]) == sorted(first_step_at.values())


def test_abort_frees_the_slot_at_the_next_step_and_emits_one_abort_event(gla):
    engine = _engine(gla, max_seqs=2, buckets=(1, 2), eager=True)
    engine.add_request("run", PROMPTS[0], max_tokens=50)
    engine.add_request("other", PROMPTS[1], max_tokens=50)
    engine.add_request("waiting", PROMPTS[2], max_tokens=50)
    engine.step()
    assert engine.num_running == 2 and engine.num_waiting == 1 and engine.free_slots == 0
    engine.abort("run")
    engine.abort("waiting")
    engine.abort("never-seen")  # unknown ids are ignored
    events = engine.step()
    aborts = [e for e in events if e.finish_reason == "abort"]
    assert sorted(e.request_id for e in aborts) == ["run", "waiting"]
    assert all(e.finished and e.token_id == -1 for e in aborts)
    assert engine.num_running == 1 and engine.num_waiting == 0 and engine.free_slots == 1
    engine.abort("other")
    engine.step()
    assert not engine.has_unfinished() and engine.free_slots == 2
    assert engine.stats().as_dict()["finished"] == {"abort": 3}


def test_stop_tokens_and_max_tokens_end_a_request(gla):
    alone = _alone(gla.model, PROMPTS[0], 6)
    engine = _engine(gla, eager=True)
    engine.add_request("stop", PROMPTS[0], max_tokens=6, stop_token_ids=(alone[2],))
    engine.add_request("one", PROMPTS[0], max_tokens=1)
    events = []
    while engine.has_unfinished():
        events += engine.step()
    last = {e.request_id: e for e in events if e.finished}
    stop_at = alone.index(alone[2])
    assert last["stop"].finish_reason == "stop" and last["stop"].index == stop_at and last["stop"].token_id == alone[2]
    assert last["one"].finish_reason == "length" and last["one"].index == 0
    assert engine.free_slots == 4


def test_bad_requests_are_one_line_errors_and_a_full_queue_is_queue_full(gla):
    engine = _engine(gla, max_waiting=2, max_prompt_tokens=16, max_new_tokens=8, eager=True)
    for prompt, max_tokens, message in [
        ([], 4, "empty"), (list(range(17)), 4, "at most 16"), ([1, 2], 0, "max_tokens"), ([1, 2], 9, "max_tokens"),
        ([1, 5000], 4, "token ids"),
    ]:
        with pytest.raises(AssayError, match=message):
            engine.add_request("bad", prompt, max_tokens)
    with pytest.raises(AssayError, match="temperature"):
        engine.add_request("bad", [1], 2, temperature=-1)
    engine.add_request("a", [1, 2], 2)
    with pytest.raises(AssayError, match="already in use"):
        engine.add_request("a", [1, 2], 2)
    # 4 slots free and a queue of 2: before any step, the first four requests wait only for the step that
    # admits them (not for a slot), the next two fill the queue, the seventh is refused.
    for request_id in "bcdef":
        engine.add_request(request_id, [1, 2], 8)
    with pytest.raises(QueueFull):
        engine.add_request("g", [1, 2], 8)
    engine.step()  # four take the slots and "a" (2 tokens) ends in this step: of the two still waiting, one
    # waits only for the next step, so the queue has room for one more
    assert (engine.free_slots, engine.num_waiting) == (1, 2)
    engine.add_request("g", [1, 2], 8)
    with pytest.raises(QueueFull):
        engine.add_request("h", [1, 2], 8)
    with pytest.raises(AssayError, match="below --max-seqs"):
        EngineConfig(max_seqs=8, buckets=(1, 2)).validate()


@pytest.mark.slow
def test_seeded_sampling_repeats_and_temperature_zero_is_greedy(gla):
    def run(seed):
        engine = _engine(gla, eager=True)
        engine.add_request("s", PROMPTS[0], max_tokens=12, temperature=1.5, seed=seed)
        return run_to_completion(engine)["s"]

    assert run(7) == run(7)
    assert run(7) != _alone(gla.model, PROMPTS[0], 12) or run(8) != _alone(gla.model, PROMPTS[0], 12)


def test_bfloat16_state_halves_the_pool_and_rounds_only_what_it_keeps(gla):
    engine32 = _engine(gla, eager=True)
    engine16 = _engine(gla, eager=True, state_dtype="bfloat16")
    assert all(b.dtype == torch.bfloat16 for b in engine16.pool.buffers)
    assert engine16.stats().memory.state_bytes_per_sequence * 2 == engine32.stats().memory.state_bytes_per_sequence
    prompt = torch.tensor([PROMPTS[2]])
    slot = engine16.pool.allocate()
    with torch.no_grad():
        engine16.slot_model.prefill(prompt, slot, engine16.pool.buffers)
        _, state = gla.model.prefill(prompt)
        # What the pool keeps is the float32 state rounded to bfloat16, nothing else.
        for buffer, layer_state in zip(engine16.pool.buffers, state):
            assert torch.equal(buffer[slot], layer_state[0].to(torch.bfloat16))
        # One decode step from the rounded state (the step itself runs in float32): its logits stay within
        # the bfloat16 recurrence tolerance of the float32 state's, and differ (the rounding is real).
        next_token = torch.tensor([[7]])
        slot_ids = torch.tensor([slot])
        logits16 = engine16.slot_model.decode(next_token, slot_ids, slot_ids, engine16.pool.buffers)
        logits32 = gla.model.decode_step(next_token, [s.clone() for s in state])[0][:, 0]
    assert 0 < rel_error(logits16, logits32) <= tolerance("recurrence", torch.bfloat16)
    assert all(b[slot].dtype == torch.bfloat16 for b in engine16.pool.buffers)
    engine16.pool.release(slot)
    # And a whole run through the bfloat16 pool finishes every request and frees every slot.
    for index, prompt_tokens in enumerate(PROMPTS):
        engine16.add_request(f"r{index}", prompt_tokens, max_tokens=5)
    tokens = run_to_completion(engine16)
    assert all(len(tokens[f"r{i}"]) == 5 for i in range(len(PROMPTS))) and engine16.free_slots == 4


def test_memory_facts_state_is_constant_and_far_below_a_kv_cache(gla):
    from assay.models.gla import state_bytes_per_sequence

    memory = _engine(gla, eager=True).stats().memory
    assert memory.constant_state and memory.max_len is None
    assert memory.state_bytes_per_sequence == state_bytes_per_sequence(gla.args)
    args = gla.args
    assert memory.kv_bytes_per_sequence[2048] == 2 * args.n_layers * args.dim * 2048 * 2  # bf16 keys + values
    assert memory.kv_bytes_per_sequence[8192] == 4 * memory.kv_bytes_per_sequence[2048]


@pytest.mark.inductor
def test_compiled_inductor_logits_match_eager_within_the_float32_tolerance(gla):
    # The one real inductor test: every compiled decode step is also run eagerly on the same inputs. The library
    # GEMM: inductor's fusion of the GLA step is the point here; the C++ template is test_decode_gemm.py's.
    engine = _engine(gla, max_seqs=2, buckets=(2,), backend="inductor", check_eager=True, decode_gemm="aten")
    engine.warm_up()
    for index in range(3):
        engine.add_request(f"r{index}", PROMPTS[index], max_tokens=6)
    tokens = run_to_completion(engine)
    check = engine.stats().as_dict()["eager_check"]
    assert check["steps"] == engine.stats().as_dict()["decode_steps"] > 0
    # ("compiled_vs_eager", float32) = 1e-4: fusion reassociates float32 sums, nothing more.
    assert check["max_rel"] <= tolerance("compiled_vs_eager", torch.float32)
    assert all(tokens[f"r{i}"] == _alone(gla.model, PROMPTS[i], 6) for i in range(3))


def _greedy_full_forward(model, prompt: list[int], n: int) -> list[int]:
    """The reference without any cache: the whole sequence through forward() for every new token."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            sequence.append(int(model(torch.tensor([sequence]))[0, -1].argmax()))
    return sequence[len(prompt):]


@pytest.mark.parametrize("entry", ["qwen3", "llama"])
def test_a_kv_cache_model_through_the_same_engine_gives_its_full_forward_greedy_tokens(zoo_dir, entry):
    # Same engine, a KV cache per slot instead of a fixed state; rows at different positions share a batch.
    # llama: the native Llama (assay.models.llama) loading the zoo's Transformers Llama checkpoint.
    engine = Engine.from_checkpoint(zoo_dir / entry, EngineConfig(max_seqs=4, buckets=(1, 2, 4), eager=True, max_len=64))
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{index}", prompt, max_tokens=3 + index)
    tokens = run_to_completion(engine)
    model = engine.slot_model.model
    for index, prompt in enumerate(PROMPTS):
        assert tokens[f"r{index}"] == _greedy_full_forward(model, prompt, 3 + index), f"request r{index}"
    memory = engine.stats().memory
    args = engine.slot_model.args
    assert not memory.constant_state and memory.max_len == 64
    assert memory.state_bytes_per_sequence == 2 * args.n_layers * args.n_kv_heads * args.head_dim * 64 * 4
    assert engine.free_slots == 4
    with pytest.raises(AssayError, match="positions of a KV-cache slot"):
        engine.add_request("long", list(range(60)), max_tokens=8)


def test_qwen3_compiled_decode_compiles_once_per_width_as_positions_grow(zoo_dir):
    engine = Engine.from_checkpoint(zoo_dir / "qwen3", EngineConfig(max_seqs=2, buckets=(1, 2), backend="aot_eager", max_len=48))
    engine.warm_up()
    for index in range(3):
        engine.add_request(f"r{index}", PROMPTS[index], max_tokens=8)
    run_to_completion(engine)
    stats = engine.stats().as_dict()
    assert stats["warmup_compiles"] == 2 and stats["compiles"] == 0 and stats["decode_steps"] >= 8


def test_a_checkpoint_of_an_architecture_not_served_is_a_clear_error(zoo_dir):
    with pytest.raises(AssayError, match="model_type 'gpt2' is not served"):
        Engine.from_checkpoint(zoo_dir / "gpt2", EngineConfig(eager=True))


def test_the_engine_exposes_the_checkpoint_tokenizer(zoo_dir):
    engine = Engine.from_checkpoint(zoo_dir / "gla", EngineConfig(max_seqs=1, buckets=(1,), eager=True))
    ids = engine.tokenizer("The Python language")["input_ids"]
    assert ids and engine.tokenizer.decode(ids) == "The Python language"


def test_a_prefill_budget_spreads_admissions_over_steps_and_chunks_a_long_prompt(gla):
    engine = _engine(gla, eager=True, max_seqs=4, buckets=(1, 2, 4), max_prefill_tokens=8)
    for index in range(3):
        engine.add_request(f"short{index}", [5, 6, 7, 8], max_tokens=6)  # 4 tokens each: two fit the budget
    engine.add_request("long", list(range(10, 30)), max_tokens=2)  # 20 tokens: over the budget on its own
    tokens: dict[str, list[int]] = {}

    def step():
        for event in engine.step():
            tokens.setdefault(event.request_id, []).append(event.token_id)

    step()
    assert engine.num_running == 2 and engine.num_waiting == 2
    step()
    # short2 (4) and the first 4 tokens of long share the budget: long holds a slot while it prefills
    assert engine.num_running == 3 and engine.num_waiting == 0 and engine.free_slots == 0
    step()
    assert engine.num_running == 3 and "long" not in tokens, "8 more of long's 20 tokens: still prefilling"
    step()
    assert len(tokens["long"]) == 2 and engine.num_running == 3, "the last 8: its first token, a decode, and done"
    while engine.has_unfinished():
        step()
    assert engine.free_slots == 4 and tokens["long"] == _alone(gla.model, list(range(10, 30)), 2)
    assert all(tokens[f"short{i}"] == _alone(gla.model, [5, 6, 7, 8], 6) for i in range(3))
    assert engine.stats().as_dict()["prefill_calls"] == 4


def test_without_max_len_a_kv_slot_stops_at_the_model_positions_and_fits_the_free_memory(zoo_dir, monkeypatch):
    # Defaults ask for 8,192 + 4,096 positions per slot: past the zoo Llama's 2,048 (its rotary table would
    # be stretched), and for a real model's 64 slots more memory than a machine has.
    config = EngineConfig(max_seqs=2, buckets=(1, 2), eager=True)
    engine = Engine.from_checkpoint(zoo_dir / "llama", config)
    assert engine.stats().memory.max_len == engine.slot_model.max_positions() == 2048
    per_position = engine.slot_model.state_bytes_per_sequence(torch.float32, 1)
    # The machine's free-memory reading set so that half of it holds 3 slots (2 + scratch) of 600 positions.
    monkeypatch.setattr("assay.serve.runner.sizing.free_memory_bytes", lambda device: 2 * 3 * 600 * per_position)
    assert Engine.from_checkpoint(zoo_dir / "llama", config).stats().memory.max_len == 512  # rounded down to 256s
    monkeypatch.setattr("assay.serve.runner.sizing.free_memory_bytes", lambda device: 2 * 3 * 100 * per_position)
    with pytest.raises(AssayError, match="lower --max-seqs"):
        Engine.from_checkpoint(zoo_dir / "llama", config)
    # An explicit --max-len is kept, and refused with its size when the pool cannot fit at all.
    with pytest.raises(AssayError, match=r"the slot pool needs .* GiB \(2 slots \+ 1 scratch x 1024 positions\)"):
        Engine.from_checkpoint(zoo_dir / "llama", EngineConfig(max_seqs=2, buckets=(1, 2), eager=True, max_len=1024))
