"""Batched prefill of every KV-cache architecture (the slot adapters' prefill_batch): a right-padded batch of
prompts of different lengths, and later chunks continuing earlier ones, give the logits and the slot contents
of one prompt at a time.

Tolerances: logits and cache rows with ("model_logits", float32), relative error <= 1e-5: the batched pass is
the same float32 math over a padded batch (a masked softmax over cached + chunk keys for a continuation), so
only summation order separates it from one prompt at a time. What must not change at all (rows of other
slots, positions a prompt never reached) is compared exactly.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models import registry

KV_ARCHS = [name for name in registry.names() if registry.get(name).cache.grows]
MAX_LEN = 24
N_ROWS = 6
SLOTS = [4, 1, 3]
LENGTHS = [5, 13, 9]  # the longest past a tiny sliding window (Gemma 3's tiny flavour: 8)
FIRST_CHUNK = [3, 6, 9]  # the third row is whole in the first call, fresh in neither


def _model(name: str):
    spec = registry.get(name)
    args = replace(spec.flavours["tiny"], max_seq_len=64)
    model = spec.build(args, "cpu", torch.float32, seed=0)
    # A wider init than 0.02: logits far from uniform, so a wrong key or a leaked pad shows.
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    return spec.wrap_slot_model(model.eval(), args)


def _noisy_pool(adapter) -> list[torch.Tensor]:
    # Stale contents from "earlier sequences": a fresh prefill must ignore them, a pad must not overwrite them.
    buffers = adapter.pool_buffers(N_ROWS, torch.float32, MAX_LEN)
    generator = torch.Generator().manual_seed(2)
    for buffer in buffers:
        buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return buffers


def _prompts(vocab_size: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (length,), generator=generator) for length in LENGTHS]


def _padded(rows: list[torch.Tensor], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] right-padded with random tokens (a pad that leaked would change the result), and the lengths."""
    width = max(len(row) for row in rows)
    pads = torch.randint(3, vocab_size, (len(rows), width), generator=torch.Generator().manual_seed(3))
    tokens = torch.stack([torch.cat([row, pads[i, len(row):]]) for i, row in enumerate(rows)])
    return tokens, torch.tensor([len(row) for row in rows])


def _one_at_a_time(adapter, prompts) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    buffers = _noisy_pool(adapter)
    with torch.no_grad():
        logits = [adapter.prefill(prompt[None], slot, buffers) for prompt, slot in zip(prompts, SLOTS)]
    return logits, buffers


@pytest.fixture(scope="module", params=KV_ARCHS)
def reference(request):
    adapter = _model(request.param)
    prompts = _prompts(adapter.args.vocab_size)
    logits, buffers = _one_at_a_time(adapter, prompts)
    return adapter, prompts, logits, buffers


def _assert_same_pool(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    others = [row for row in range(N_ROWS) if row not in SLOTS]
    for got, want in zip(actual, expected):
        assert torch.equal(got[others], want[others]), "a row outside slot_ids changed"
        assert_close("model_logits", got[SLOTS], want[SLOTS], torch.float32)
        # Entries no real token reached keep the stale noise bit for bit (pads wrote nothing).
        untouched = (got[SLOTS] == want[SLOTS]).all(dim=(-1, -2))  # [3, L]
        for row, length in enumerate(LENGTHS):
            ring = got.shape[1]
            assert untouched[row, min(length, ring):].all(), "a pad wrote past its row's last real token"


def test_a_padded_batch_equals_one_prompt_at_a_time(reference):
    adapter, prompts, logits, buffers = reference
    tokens, lengths = _padded(prompts, adapter.args.vocab_size)
    batched = _noisy_pool(adapter)
    with torch.no_grad():
        got = adapter.prefill_batch(tokens, torch.tensor(SLOTS), batched, lengths=lengths)
    assert got.shape == (3, adapter.args.vocab_size) and got.dtype == torch.float32
    for row, want in enumerate(logits):
        assert_close("model_logits", got[row], want, torch.float32)
    _assert_same_pool(batched, buffers)


def test_a_second_chunk_continues_the_first(reference):
    adapter, prompts, logits, buffers = reference
    vocab = adapter.args.vocab_size
    chunked = _noisy_pool(adapter)
    slots = torch.tensor(SLOTS)
    with torch.no_grad():
        first, first_lengths = _padded([p[:n] for p, n in zip(prompts, FIRST_CHUNK)], vocab)
        adapter.prefill_batch(first, slots, chunked, lengths=first_lengths)
        # The second call: two rows continue where their first chunk stopped; the third, already whole, is
        # prefilled again from scratch (start 0) in the same batch.
        rest = [p[n:] for p, n in zip(prompts[:2], FIRST_CHUNK[:2])] + [prompts[2]]
        second, second_lengths = _padded(rest, vocab)
        starts = torch.tensor([FIRST_CHUNK[0], FIRST_CHUNK[1], 0])
        after_first = _clone(chunked)
        got = adapter.prefill_batch(second, slots, chunked, lengths=second_lengths, start_positions=starts)
        every = adapter.prefill_batch(second, slots, after_first, lengths=second_lengths, start_positions=starts, all_logits=True)
        forward = [adapter.model(prompt[None])[0] for prompt in prompts]
    for row, want in enumerate(logits):
        assert_close("model_logits", got[row], want, torch.float32)
    # all_logits: every real position of the chunk is the model's forward() logit at that position.
    for row, (start, length) in enumerate(zip(starts.tolist(), second_lengths.tolist())):
        assert_close("model_logits", every[row, :length], forward[row][start:start + length], torch.float32)
    _assert_same_pool(chunked, buffers)


def _clone(buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    return [buffer.clone() for buffer in buffers]


def test_decoding_after_a_batched_prefill_follows_the_prompt(reference):
    adapter, prompts, _, _ = reference
    tokens, lengths = _padded(prompts, adapter.args.vocab_size)
    buffers = _noisy_pool(adapter)
    with torch.no_grad():
        adapter.prefill_batch(tokens[:, :-1], torch.tensor(SLOTS), buffers, lengths=lengths - 1)
        last = torch.stack([prompt[-1] for prompt in prompts])[:, None]
        decoded = adapter.decode(last, torch.tensor(SLOTS), lengths - 1, buffers)
        for row, prompt in enumerate(prompts):
            assert_close("model_logits", decoded[row], adapter.model(prompt[None])[0, -1], torch.float32)


def test_a_chunk_past_the_slot_is_refused(reference):
    adapter = reference[0]
    buffers = adapter.pool_buffers(2, torch.float32, 8)
    tokens = torch.ones(1, 5, dtype=torch.int64)
    with pytest.raises(AssayError, match="exceeds the KV cache length 8"):
        adapter.prefill_batch(tokens, torch.tensor([0]), buffers, start_positions=torch.tensor([4]))
    with pytest.raises(AssayError, match="lengths must be"):
        adapter.prefill_batch(tokens, torch.tensor([0]), buffers, lengths=torch.tensor([6]))
