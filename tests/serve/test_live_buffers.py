"""An eager KV decode sees only the positions its rows hold (SlotModel.live_buffers): the same logits and
the same cache writes as a decode over the whole pool, across the LIVE_GRAIN boundary, with a sliding-window
ring (Gemma 3's window of 8) as well as full-attention layers. Rows of very different lengths attend in
groups, each over its own prefix (kv_cache.row_groups): the same logits as each row decoded alone.

Tolerance ("model_logits", float32) = 1e-5: the same attention with the masked tail left out, which changes
only the length of the softmax's reduction (its masked entries add exact zeros).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models import registry
from assay.models.common.kv_cache import GROUP_COST, row_groups
from assay.models.common.kv_cache import LIVE_GRAIN

MAX_LEN = 3 * LIVE_GRAIN


def _slot_model(name: str):
    spec = registry.get(name)
    args = replace(spec.flavours["tiny"], max_seq_len=MAX_LEN)
    model = spec.build(args, "cpu", torch.float32, seed=0)
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    return spec.wrap_slot_model(model.eval(), args)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_live_view_decodes_as_the_whole_pool_across_the_grain(name):
    slot_model = _slot_model(name)
    pool = slot_model.pool_buffers(3, torch.float32, MAX_LEN)
    generator = torch.Generator().manual_seed(1)
    lengths = [LIVE_GRAIN - 2, 40]  # row 0 crosses the grain in the steps below; row 1 stays far inside it
    prompts = torch.randint(3, slot_model.args.vocab_size, (2, max(lengths)), generator=generator)
    slots = torch.tensor([0, 1])
    with torch.no_grad():
        slot_model.prefill_batch(prompts, slots, pool, lengths=torch.tensor(lengths))
        whole = [buffer.clone() for buffer in pool]
        positions = torch.tensor(lengths)
        for _ in range(4):  # positions 126..129 for row 0: views of 128, then 256 positions
            tokens = torch.randint(3, slot_model.args.vocab_size, (2, 1), generator=generator)
            live = slot_model.live_buffers(pool, int(positions.max()) + 1)
            assert max(buffer.shape[1] for buffer in live) == min(MAX_LEN, -(-(int(positions.max()) + 1) // LIVE_GRAIN) * LIVE_GRAIN)
            got = slot_model.decode(tokens, slots, positions, live)
            want = slot_model.decode(tokens, slots, positions, whole)
            assert_close("model_logits", got, want, torch.float32)
            positions = positions + 1
    for kept, reference in zip(pool, whole):  # the views wrote into the pool what the whole-pool decode wrote
        assert_close("model_logits", kept, reference, torch.float32)


def test_a_fixed_state_has_no_positions_to_leave_out():
    slot_model = _slot_model("gla")
    pool = slot_model.pool_buffers(2, torch.float32, MAX_LEN)
    assert slot_model.live_buffers(pool, 5) is pool


def test_rows_are_grouped_by_the_length_they_hold_when_that_saves_work():
    ring = 17 * LIVE_GRAIN  # SmolLM2's 2,176-position slot
    positions = torch.tensor([100] * 15 + [2000])  # 15 short rows and one 2K-token sequence
    slots = torch.arange(16) + 1
    visible = torch.ones(16, 1, 1, ring, dtype=torch.bool)
    groups = row_groups(positions, slots, visible, ring)
    assert [(g.rows.tolist(), g.live) for g in groups] == [(list(range(15)), LIVE_GRAIN), ([15], 16 * LIVE_GRAIN)]
    assert groups[1].slot_ids.tolist() == [16] and groups[0].visible.shape == (15, 1, 1, LIVE_GRAIN)
    # 16 x 2,048 row-positions padded against 15 x 128 + 2,048 + GROUP_COST: split. Lengths within one grain,
    # or a split saving less than GROUP_COST, stay one call.
    assert row_groups(torch.tensor([5, 100, 127]), slots[:3], visible[:3], ring) is None
    assert row_groups(torch.tensor([100, 200]), slots[:2], visible[:2], ring) is None  # saves 128 < GROUP_COST
    assert GROUP_COST < 15 * (16 - 1) * LIVE_GRAIN


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_grouped_rows_decode_as_each_row_alone(name):
    slot_model = _slot_model(name)
    pool = slot_model.pool_buffers(5, torch.float32, MAX_LEN)
    generator = torch.Generator().manual_seed(2)
    lengths = [MAX_LEN - 40, 9, 12, 30]  # one long row, three short: two groups in every full-attention layer
    prompts = torch.randint(3, slot_model.args.vocab_size, (4, max(lengths)), generator=generator)
    slots = torch.tensor([3, 0, 1, 2])
    with torch.no_grad():
        slot_model.prefill_batch(prompts, slots, pool, lengths=torch.tensor(lengths))
        alone_pool = [buffer.clone() for buffer in pool]
        positions = torch.tensor(lengths)
        assert len(row_groups(positions, slots, torch.ones(4, 1, 1, MAX_LEN, dtype=torch.bool), MAX_LEN)) == 2
        for _ in range(3):
            tokens = torch.randint(3, slot_model.args.vocab_size, (4, 1), generator=generator)
            grouped = slot_model.decode(tokens, slots, positions, pool)
            alone = torch.cat([slot_model.decode(tokens[i : i + 1], slots[i : i + 1], positions[i : i + 1], alone_pool) for i in range(4)])
            assert_close("model_logits", grouped, alone, torch.float32)
            positions = positions + 1
    for kept, reference in zip(pool, alone_pool):
        assert_close("model_logits", kept, reference, torch.float32)
