"""The compiled prefill (serve/runner/compiled_prefill.py) on the tiny zoo: four graphs, compiled at warm-up,
serve every batch shape with the eager prefill's logits and slot contents; models whose prefill does not trace
whole prefill eagerly. aot_eager throughout: what is tested is the tracing and the shapes (the real model's
compiled server, tests/serve/test_real_serving.py, runs it under inductor).
"""

from __future__ import annotations

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import rel_error, tolerance
from assay.serve import Engine, EngineConfig, run_to_completion
from assay.serve.runner.runner import ModelRunner, PrefillInput
from assay.serve.runner.weights import load_slot_model

CPU = torch.device("cpu")
MAX_LEN = 64
# The compiled call attends over the pool's whole length (masked past each row's positions), and a fresh row in
# a batch that continues others takes the masked path: the same sums, reassociated (compiled_vs_eager, 1e-4).
TOLERANCE = tolerance("compiled_vs_eager", torch.float32)

# Each list is one prefill call; the slots keep what earlier calls wrote (later chunks continue them).
CALLS = [
    [PrefillInput([5, 6, 7, 8, 9], slot=0, start=0)],  # one row
    [PrefillInput([42], slot=1, start=0)],  # one token: padded to two positions
    [PrefillInput([10, 11, 12], slot=2, start=0), PrefillInput(list(range(100, 117)), slot=3, start=0)],  # two rows
    [PrefillInput([13, 14, 15, 16], slot=0, start=5)],  # a later chunk of slot 0's sequence
    [PrefillInput([300, 301], slot=1, start=1), PrefillInput(list(range(200, 230)), slot=2, start=3),
     PrefillInput([7, 8, 9], slot=3, start=0)],  # continuing rows beside a fresh one
]


@pytest.fixture(scope="module")
def llama(zoo_dir):
    return load_slot_model(zoo_dir / "llama", CPU, MAX_LEN)


def test_four_graphs_compiled_at_warm_up_serve_every_batch_shape_with_the_eager_logits_and_slots(llama):
    eager = ModelRunner(llama, 4, torch.float32, MAX_LEN, CPU, None)
    compiled = ModelRunner(llama, 4, torch.float32, MAX_LEN, CPU, "aot_eager", compile_prefill=True)
    assert eager.prefiller is None and compiled.prefiller is not None
    assert ModelRunner(llama, 4, torch.float32, MAX_LEN, CPU, "aot_eager").prefiller is None  # opt-in
    assert compiled.warm_up_prefill() == 4  # each kind at 2 and 64 tokens: one graph each
    for rows in CALLS:
        expected, got = eager.prefill(rows, all_logits=False), compiled.prefill(rows, all_logits=False)
        assert not expected.compiled_call and got.compiled_call and not got.compiled, rows
        assert got.logits.shape == expected.logits.shape == (len(rows), llama.args.vocab_size)
        assert rel_error(got.logits, expected.logits) <= TOLERANCE, rows
    assert compiled.prefiller.compile_stats.graphs == 4  # nothing compiled after the warm-up
    # The slots hold the same keys and values (the scratch slot, last, took the warm-up's padding rows).
    for ours, theirs in zip(compiled.pool.buffers, eager.pool.buffers):
        assert rel_error(ours[:4], theirs[:4]) <= TOLERANCE


def test_prompt_logprobs_calls_stay_eager_and_a_row_past_the_slot_is_refused_on_the_host(llama):
    compiled = ModelRunner(llama, 2, torch.float32, MAX_LEN, CPU, "aot_eager", compile_prefill=True)
    every = compiled.prefill([PrefillInput([5, 6, 7], slot=0, start=0)], all_logits=True)
    assert not every.compiled_call and every.logits.shape == (1, 3, llama.args.vocab_size)
    with pytest.raises(AssayError, match=f"within the slot's {MAX_LEN} positions") as refused:
        compiled.prefill([PrefillInput([1, 2, 3], slot=1, start=MAX_LEN - 2)], all_logits=False)
    assert "\n" not in str(refused.value)
    assert compiled.prefiller.compile_stats.graphs == 0  # refused before anything was traced


@pytest.mark.parametrize("name", ["qwen3-moe", "gla"])
def test_a_prefill_that_does_not_trace_whole_stays_eager_under_a_compiled_engine(zoo_dir, name):
    # A mixture of experts routes with a host sync per layer; GLA's chunked recurrence is too slow to trace.
    slot_model = load_slot_model(zoo_dir / name, CPU, MAX_LEN)
    assert not slot_model.compiles_prefill
    runner = ModelRunner(slot_model, 2, torch.float32, MAX_LEN, CPU, "aot_eager", compile_prefill=True)
    assert runner.prefiller is None and runner.warm_up_prefill() == 0
    assert not runner.prefill([PrefillInput([5, 6, 7], slot=0, start=0)], all_logits=False).compiled_call


def test_a_compiled_engine_prefills_chunked_prompts_compiled_with_no_compile_while_serving(llama):
    # A 6-token prefill budget chunks the longer prompts over steps: continuing rows beside fresh ones.
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(100, 117)), [42]]
    tokens = {}
    for mode in ("eager", "compiled"):
        config = EngineConfig(max_seqs=4, buckets=(1, 2, 4), backend="aot_eager", eager=mode == "eager", max_len=MAX_LEN,
                              max_prefill_tokens=6, long_prefill_token_threshold=0, compile_prefill=mode == "compiled")
        engine = Engine(llama, config)
        engine.warm_up()
        for index, prompt in enumerate(prompts):
            engine.add_request(f"r{index}", prompt, max_tokens=4)
        tokens[mode] = run_to_completion(engine)
        stats = engine.stats().as_dict()
    assert stats["prefill_warmup_compiles"] == 4 and stats["prefill_compiles"] == 0 and stats["prefill_compile_s"] == 0
    assert stats["prefill_calls"] > len(prompts), "no prompt was chunked: the continuing graph was not used"
    assert stats["prefill_compiled_calls"] == stats["prefill_calls"]
    # The zoo's std 0.2 keeps its logits far from ties: reassociated sums pick the same greedy tokens.
    assert tokens["compiled"] == tokens["eager"]


def test_compile_prefill_asks_for_a_compiled_engine(zoo_dir, assay_cli):
    # On a CPU a plain `assay serve` is eager: --compile-prefill, like --backend, makes it compiled; with --eager
    # it is refused in one line before anything loads.
    from assay.serve.settings import ServeRequest

    assert not ServeRequest(model=str(zoo_dir / "llama"), compile_prefill=True).eager
    result = assay_cli("serve", "--model", str(zoo_dir / "llama"), "--port", "0", "--eager", "--compile-prefill")
    assert result.returncode == 2 and result.stderr.strip() == "error: --compile-prefill needs a compiled engine: drop --eager", result.stderr


def test_a_model_that_branches_on_its_token_count_gets_each_branch_at_warm_up(zoo_dir):
    # --quantize int8 multiplies 128 rows and more by the dequantized weight, fewer through the int8 kernel: a
    # guard on the dynamic token count. The warm-up's two lengths (2 and 256) compile both branches of each kind.
    from assay.serve.runner.quantize import DEQUANTIZED_ROWS

    slot_model = load_slot_model(zoo_dir / "llama", CPU, 300)
    runner = ModelRunner(slot_model, 2, torch.float32, 300, CPU, "aot_eager", quantize="int8", compile_prefill=True)
    assert runner.warm_up_prefill() == 8
    long_row = list(range(5, 5 + DEQUANTIZED_ROWS + 20))
    for rows in ([PrefillInput(long_row, 0, 0), PrefillInput([7, 8, 9], 1, 0)], [PrefillInput([1, 2, 3], 0, len(long_row))],
                 [PrefillInput(long_row, 1, 3)]):
        result = runner.prefill(rows, all_logits=False)
        assert result.compiled_call and not result.compiled, rows
    assert runner.prefiller.compile_stats.graphs == 8
