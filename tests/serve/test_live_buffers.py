"""An eager KV decode sees only the positions its rows hold (ModelAdapter.live_buffers): the same logits and
the same cache writes as a decode over the whole pool, across the LIVE_GRAIN boundary, with a sliding-window
ring (Gemma 3's window of 8) as well as full-attention layers.

Tolerance ("model_logits", float32) = 1e-5: the same attention with the masked tail left out, which changes
only the length of the softmax's reduction (its masked entries add exact zeros).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models import registry
from assay.models.serving import LIVE_GRAIN

MAX_LEN = 3 * LIVE_GRAIN


def _adapter(name: str):
    spec = registry.get(name)
    args = replace(spec.flavours["tiny"], max_seq_len=MAX_LEN)
    model = spec.build(args, "cpu", torch.float32, seed=0)
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    return spec.adapter_for(model.eval(), args)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_live_view_decodes_as_the_whole_pool_across_the_grain(name):
    adapter = _adapter(name)
    pool = adapter.pool_buffers(3, torch.float32, MAX_LEN)
    generator = torch.Generator().manual_seed(1)
    lengths = [LIVE_GRAIN - 2, 40]  # row 0 crosses the grain in the steps below; row 1 stays far inside it
    prompts = torch.randint(3, adapter.args.vocab_size, (2, max(lengths)), generator=generator)
    slots = torch.tensor([0, 1])
    with torch.no_grad():
        adapter.prefill_batch(prompts, slots, pool, lengths=torch.tensor(lengths))
        whole = [buffer.clone() for buffer in pool]
        positions = torch.tensor(lengths)
        for _ in range(4):  # positions 126..129 for row 0: views of 128, then 256 positions
            tokens = torch.randint(3, adapter.args.vocab_size, (2, 1), generator=generator)
            live = adapter.live_buffers(pool, int(positions.max()) + 1)
            assert max(buffer.shape[1] for buffer in live) == min(MAX_LEN, -(-(int(positions.max()) + 1) // LIVE_GRAIN) * LIVE_GRAIN)
            got = adapter.decode(tokens, slots, positions, live)
            want = adapter.decode(tokens, slots, positions, whole)
            assert_close("model_logits", got, want, torch.float32)
            positions = positions + 1
    for kept, reference in zip(pool, whole):  # the views wrote into the pool what the whole-pool decode wrote
        assert_close("model_logits", kept, reference, torch.float32)


def test_a_fixed_state_has_no_positions_to_leave_out():
    adapter = _adapter("gla")
    pool = adapter.pool_buffers(2, torch.float32, MAX_LEN)
    assert adapter.live_buffers(pool, 5) is pool
