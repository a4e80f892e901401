"""Padded batches through the GLA: a pad position leaves the recurrent state and the convolution window as
the row's real tokens left them, so a left-padded batch under Transformers' generate() gives every row
what the row alone gives, with and without short convolutions, and the native model's right-padded
prefill ends each row's state at its last real token.

Greedy tokens are compared exactly (the same argmax on logits that agree to float32 rounding: the pads'
zeros add exact zeros to every sum); states and conv windows with ("recurrence", float32) = 1e-4.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models.gla import FLAVOURS, GLA, SPEC

PROMPTS = ["The cat", "Once upon a time there was a small village by the sea, and", "In the morning the market"]


@pytest.fixture(scope="module", params=["zoo", "short_conv"])
def checkpoint(request, zoo_dir, tmp_path_factory):
    """The zoo's pretrained GLA, and a short-convolution GLA (std 0.2: logits far from uniform) exported with
    the zoo tokenizer, as tests/models/test_gla_short_conv.py builds it."""
    if request.param == "zoo":
        return zoo_dir / "gla-pretrained"
    args = replace(FLAVOURS["tiny"], use_short_conv=True)
    folder = tmp_path_factory.mktemp("gla-conv")
    SPEC.export_hf(GLA.build(args, seed=0, std=0.2), args, folder, tokenizer_source_dir=zoo_dir / "gla-pretrained")
    return folder


def test_left_padded_batch_generates_what_each_prompt_generates_alone(checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert len(set(lengths)) == len(PROMPTS) and min(lengths) < max(lengths) - 5  # really padded, by different amounts
    new = 12
    with torch.no_grad():
        together = model.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for row, prompt in enumerate(PROMPTS):
            alone = tokenizer(prompt, return_tensors="pt")
            expected = model.generate(**alone, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            assert together[row, -new:].tolist() == expected[0, -new:].tolist(), prompt


def test_right_padded_prefill_ends_each_row_at_its_last_real_token():
    # The native model, right padding: each row's state (and conv window) equals that row's unpadded prefill,
    # and the logits at its real positions equal the unpadded ones.
    args = replace(FLAVOURS["tiny"], use_short_conv=True)
    model = GLA.build(args, seed=0, std=0.2).eval()
    lengths = [5, 23, 1]
    tokens = torch.randint(3, args.vocab_size, (3, 23), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(23).view(1, -1) < torch.tensor(lengths).view(-1, 1)
    with torch.no_grad():
        logits, state = model.prefill(tokens.masked_fill(~mask, 0), mask=mask)
        for row, length in enumerate(lengths):
            row_logits, row_state = model.prefill(tokens[row : row + 1, :length])
            assert_close("recurrence", logits[row, :length], row_logits[0], torch.float32)
            for batched, alone in zip(state, row_state):
                assert_close("recurrence", batched[row], alone[0], torch.float32)


@pytest.mark.parametrize("short_conv", [False, True])
def test_prefill_batch_equals_one_prompt_at_a_time_and_a_second_chunk_continues(short_conv):
    # The serving contract (SlotModel.prefill_batch): a right-padded batch of prompts of different lengths
    # gives each row's last logits and slot contents as that prompt alone; a second chunk continuing from the
    # slots equals the whole prompt in one pass; slots not in the batch are untouched.
    from assay.models.slots import StateSlotModel

    args = replace(FLAVOURS["tiny"], use_short_conv=short_conv)
    adapter = StateSlotModel(GLA.build(args, seed=0, std=0.2).eval(), args, "gla")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, args.vocab_size, (n,), generator=generator) for n in (7, 30, 2)]
    slots = torch.tensor([3, 1, 4])

    def padded(pieces):
        width = max(len(p) for p in pieces)
        return torch.stack([torch.cat([p, torch.zeros(width - len(p), dtype=torch.int64)]) for p in pieces]), torch.tensor([len(p) for p in pieces])

    with torch.no_grad():
        batched = adapter.pool_buffers(6, torch.float32, 64)
        for buffer in batched:  # old contents in every slot: a fresh row must ignore them, other slots keep them
            buffer.normal_(generator=generator)
        untouched = [buffer[[0, 2, 5]].clone() for buffer in batched]
        tokens, lengths = padded(prompts)
        logits = adapter.prefill_batch(tokens, slots, batched, lengths=lengths)
        alone = adapter.pool_buffers(6, torch.float32, 64)
        for row, (prompt, slot) in enumerate(zip(prompts, slots.tolist())):
            expected = adapter.prefill(prompt.view(1, -1), slot, alone)
            assert_close("recurrence", logits[row], expected, torch.float32)
            for mine, theirs in zip(batched, alone):
                assert_close("recurrence", mine[slot], theirs[slot], torch.float32)
        for buffer, before in zip(batched, untouched):
            assert torch.equal(buffer[[0, 2, 5]], before)

        # A second chunk of different lengths continues each row from its slot: equal to each whole prompt.
        extra = [torch.randint(3, args.vocab_size, (n,), generator=generator) for n in (5, 1, 12)]
        tokens, lengths = padded(extra)
        logits = adapter.prefill_batch(tokens, slots, batched, lengths=lengths, start_positions=torch.tensor([7, 30, 2]), all_logits=True)
        whole = adapter.pool_buffers(6, torch.float32, 64)
        for row, (first, second, slot) in enumerate(zip(prompts, extra, slots.tolist())):
            expected = adapter.prefill(torch.cat([first, second]).view(1, -1), slot, whole, all_logits=True)
            assert_close("recurrence", logits[row, : len(second)], expected[len(first):], torch.float32)
            for mine, theirs in zip(batched, whole):
                assert_close("recurrence", mine[slot], theirs[slot], torch.float32)
