"""KV-cache decoding of the native Qwen3: prefill + decode steps give forward()'s logits.

Every logit comparison is float32 cached decoding against forward() of the same weights in float64,
within the ("model_logits", float32) tolerance (relative error <= 1e-5): the cached path is the same
math summed in another order (a masked softmax over the whole static row), so only float32 rounding
separates the two.
"""

from __future__ import annotations

import pytest
import torch

from assay.core.compiling import CompileStats, compile_fn, reset
from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models.qwen3 import SPEC, Qwen3

MAX_LEN = 16
N_ROWS = 6
# Three sequences of different total lengths, prompts of different lengths, in non-contiguous slots.
SLOTS = [4, 1, 3]
PROMPT_LENS = [5, 3, 7]
TOTAL_LENS = [12, 9, 11]


def tiny_model(name: str):
    model = Qwen3.build(SPEC.flavour(name))
    # A wider init than 0.02 makes the logits (and the MoE routing) far from uniform.
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    return model.eval()


def sequences(vocab_size: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (length,), generator=generator) for length in TOTAL_LENS]


def reference_logits(name: str, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """forward() of each whole sequence with the same weights in float64: [T, vocab] per sequence."""
    model64 = tiny_model(name).double()
    with torch.no_grad():
        return [model64(seq[None])[0] for seq in seqs]


def cached_logits(model, kv_cache, seqs: list[torch.Tensor], decode_step=None) -> list[torch.Tensor]:
    """Prefill each prompt into its slot, then decode the rest teacher-forced, all unfinished rows in one
    batch per step (so the rows of a batch sit at different positions). [T, vocab] per sequence."""
    decode_step = decode_step or model.decode_step
    per_row: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for seq, slot, prompt_len in zip(seqs, SLOTS, PROMPT_LENS):
            logits = model.prefill(seq[None, :prompt_len], kv_cache, torch.tensor([slot]))
            per_row.append([logits[0]])
        position = list(PROMPT_LENS)
        while True:
            rows = [r for r in range(len(seqs)) if position[r] < TOTAL_LENS[r]]
            if not rows:
                break
            tokens = torch.stack([seqs[r][position[r]] for r in rows])[:, None]  # [W, 1]
            slot_ids = torch.tensor([SLOTS[r] for r in rows])
            positions = torch.tensor([position[r] for r in rows])
            logits = decode_step(tokens, kv_cache, slot_ids, positions)
            for w, r in enumerate(rows):
                per_row[r].append(logits[w])
                position[r] += 1
    return [torch.cat(chunks) for chunks in per_row]


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_prefill_and_decode_steps_reproduce_forward_logits(name):
    model = tiny_model(name)
    seqs = sequences(model.args.vocab_size)
    kv_cache = model.init_kv_cache(N_ROWS, MAX_LEN)
    assert kv_cache[0][0].shape == (N_ROWS, MAX_LEN, model.args.n_kv_heads, model.args.head_dim)
    actual = cached_logits(model, kv_cache, seqs)
    for got, reference in zip(actual, reference_logits(name, seqs)):
        assert got.shape == reference.shape
        assert_close("model_logits", got, reference, torch.float32)


def test_prefill_logits_equal_forward_exactly():
    # prefill goes through the same seams and ops as forward(), so not even rounding differs.
    model = tiny_model("tiny")
    tokens = sequences(model.args.vocab_size)[0][None, :8]
    kv_cache = model.init_kv_cache(2, MAX_LEN)
    with torch.no_grad():
        assert torch.equal(model.prefill(tokens, kv_cache, torch.tensor([1])), model(tokens))


def test_rows_outside_slot_ids_are_untouched():
    model = tiny_model("tiny")
    seqs = sequences(model.args.vocab_size)
    kv_cache = model.init_kv_cache(N_ROWS, MAX_LEN)
    # Fill every row with noise first: a stray write into another row would change it.
    generator = torch.Generator().manual_seed(2)
    for k, v in kv_cache:
        k.copy_(torch.randn(k.shape, generator=generator))
        v.copy_(torch.randn(v.shape, generator=generator))
    others = [r for r in range(N_ROWS) if r not in SLOTS]
    before = [(k[others].clone(), v[others].clone()) for k, v in kv_cache]
    actual = cached_logits(model, kv_cache, seqs)
    for (k, v), (k0, v0) in zip(kv_cache, before):
        assert torch.equal(k[others], k0) and torch.equal(v[others], v0)
    # Stale noise beyond each row's length is masked out: the logits are still forward()'s.
    for got, reference in zip(actual, reference_logits("tiny", seqs)):
        assert_close("model_logits", got, reference, torch.float32)


def test_compiled_decode_step_compiles_once_across_positions():
    # A fixed width of three rows (the engine pads to bucket widths) at ten successive positions each:
    # positions are tensor values, not shapes, so one graph serves every step.
    model = tiny_model("tiny")
    seq = sequences(model.args.vocab_size)[0]
    reset()
    stats = CompileStats()
    compiled = compile_fn(model.decode_step, "aot_eager", stats)
    kv_cache = model.init_kv_cache(N_ROWS, MAX_LEN)
    eager_cache = model.init_kv_cache(N_ROWS, MAX_LEN)
    slot_ids = torch.tensor(SLOTS)
    with torch.no_grad():
        for step in range(10):
            tokens = seq[step].repeat(3)[:, None]
            # Rows start at different offsets, so each row of a step sits at its own position.
            positions = torch.tensor([step, step + 2, step + 5])
            got = compiled(tokens, kv_cache, slot_ids, positions)
            expected = model.decode_step(tokens, eager_cache, slot_ids, positions)
            assert_close("compiled_vs_eager", got, expected, torch.float32)
    assert stats.graphs == 1 and stats.recompiles == 0, stats.as_dict()
    # The compiled step wrote the cache in place, like the eager one.
    assert_close("compiled_vs_eager", kv_cache[0][0], eager_cache[0][0], torch.float32)


def test_a_compiled_decode_step_reproduces_forward_logits():
    # Compiled, the decode step attends through one_query_attention (plain ops inductor fuses), not SDPA: the
    # same teacher-forced rows as the eager test above, against forward() in float64 at the same tolerance.
    model = tiny_model("tiny")
    assert model.args.n_kv_heads < model.args.n_heads  # grouped-query: the head grouping is exercised
    seqs = sequences(model.args.vocab_size)
    reset()
    stats = CompileStats()
    compiled = compile_fn(model.decode_step, "aot_eager", stats)
    actual = cached_logits(model, model.init_kv_cache(N_ROWS, MAX_LEN), seqs, decode_step=compiled)
    for got, reference in zip(actual, reference_logits("tiny", seqs)):
        assert_close("model_logits", got, reference, torch.float32)
    assert stats.graphs >= 1


def test_kv_cache_longer_than_max_seq_len_is_an_assay_error():
    model = tiny_model("tiny")
    with pytest.raises(AssayError, match="max_seq_len"):
        model.init_kv_cache(1, model.args.max_seq_len + 1)
    kv_cache = model.init_kv_cache(1, 4)
    with pytest.raises(AssayError, match="exceeds the KV cache length"):
        model.prefill(torch.zeros(1, 5, dtype=torch.long), kv_cache, torch.tensor([0]))
