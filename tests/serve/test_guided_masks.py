"""Token masks for a batch: filled from the matchers (on the worker thread too), applied to logits in place,
with guided rows masked, free rows untouched, and a logits width that differs from the tokenizer's vocabulary."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoTokenizer

from assay.serve.guided import GrammarCompiler, TokenMasks, apply_bitmask
from assay.serve.guided.matcher import unpack_bits

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def setup(zoo_dir):
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "qwen3")
    compiler = GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
    return tokenizer, compiler


def advanced(compiler, tokenizer, text: str):
    matcher = compiler.json_schema(SCHEMA, strict=True).matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept(token)
    return matcher


def test_bit_layout_is_token_mod_32_of_word_token_div_32():
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 << 3
    bitmask[0, 1] = -2**31  # bit 31 (the sign bit): token 63
    assert unpack_bits(bitmask)[0].nonzero().flatten().tolist() == [3, 63]


@pytest.mark.parametrize("extra", [0, 64, -4])
def test_apply_masks_guided_rows_and_leaves_free_rows_bit_identical(setup, extra):
    """extra: the logits width beyond (or short of) the tokenizer's vocabulary."""
    tokenizer, compiler = setup
    vocab = compiler.vocab_size
    masks = TokenMasks(vocab, rows=3)
    matchers = {0: advanced(compiler, tokenizer, '{"ok": '), 2: advanced(compiler, tokenizer, "")}
    rows = masks.fill(matchers)
    logits = torch.randn(3, vocab + extra, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    masks.apply(logits, rows)
    assert torch.equal(logits[1], before[1])
    width = min(vocab, vocab + extra)
    for row, matcher in matchers.items():
        allowed = matcher.allowed_mask(vocab)[:width]
        assert torch.equal(logits[row, :width][allowed], before[row, :width][allowed])
        assert bool(torch.isneginf(logits[row, :width][~allowed]).all())
        assert bool(torch.isneginf(logits[row, width:]).all())  # past the tokenizer: never a guided token
    allowed_after_colon = {tokenizer.decode([t]) for t in matchers[0].allowed_mask(vocab).nonzero().flatten().tolist()}
    assert allowed_after_colon and all("true".startswith(s) or "false".startswith(s) for s in allowed_after_colon)


def test_batched_fill_equals_one_row_at_a_time(setup):
    tokenizer, compiler = setup
    texts = ['{"ok": ', "", '{"ok": t', '{"ok": false']
    masks = TokenMasks(compiler.vocab_size, rows=1, threads=2)  # grows to four rows
    matchers = {i: advanced(compiler, tokenizer, text) for i, text in enumerate(texts)}
    masks.fill(matchers)
    for row, matcher in matchers.items():
        assert torch.equal(unpack_bits(masks.bitmask[row:row + 1])[0, :compiler.vocab_size], matcher.allowed_mask(compiler.vocab_size))


@pytest.mark.parametrize("bitmask", [torch.zeros(1, 4, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int32)[:, ::2],
                                     torch.zeros(4, dtype=torch.int32)], ids=["int64", "not-contiguous", "one-dimensional"])
def test_a_bitmask_llguidance_cannot_write_through_is_refused_before_it_writes(setup, bitmask):
    # llguidance writes through the tensor's data pointer: a wrong dtype or layout would be written past.
    tokenizer, compiler = setup
    before = bitmask.clone()
    with pytest.raises(ValueError, match="contiguous int32 CPU matrix"):
        advanced(compiler, tokenizer, "").fill(bitmask, 0)
    assert torch.equal(bitmask, before)


def test_start_fill_runs_on_the_worker_thread_and_gives_the_same_masks(setup):
    tokenizer, compiler = setup
    masks = TokenMasks(compiler.vocab_size, rows=2)
    matchers = {0: advanced(compiler, tokenizer, '{"ok": '), 1: advanced(compiler, tokenizer, "")}
    seen = []
    masks._worker.submit(lambda: seen.append(threading.current_thread().name)).result()
    rows = masks.start_fill(matchers).result()
    assert rows == [0, 1] and seen[0].startswith("assay-guided-fill") and seen[0] != threading.current_thread().name
    for row, matcher in matchers.items():
        assert torch.equal(unpack_bits(masks.bitmask[row:row + 1])[0, :compiler.vocab_size], matcher.allowed_mask(compiler.vocab_size))
    masks.close()


def test_apply_bitmask_on_rows_given_by_index():
    logits = torch.zeros(4, 40)
    bitmask = torch.zeros(4, 2, dtype=torch.int32)
    bitmask[3, 1] = 1 << 2  # token 34 only
    apply_bitmask(logits, bitmask, [3], vocab_size=40)
    assert torch.equal(logits[:3], torch.zeros(3, 40))
    assert (~torch.isneginf(logits[3])).nonzero().flatten().tolist() == [34]
