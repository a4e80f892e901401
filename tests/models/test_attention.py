"""Attention over a KV cache for one query per row: one_query_attention (the compiled decode step's plain-ops
form) against SDPA's masked attention in float64, with grouped-query heads, a sliding-window mask, a query
scale and bfloat16 inputs.

Tolerances: float32 within ("model_logits", float32) = 1e-5 relative (the same sums in another order);
bfloat16 inputs within ("model_logits", bfloat16) = 3e-2 (the output is rounded to bfloat16; the
sums run in float32)."""

from __future__ import annotations

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models.common.attention import masked_attention, one_query_attention

ROWS, LENGTH, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 40, 6, 2, 16


def _inputs(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(ROWS, 1, Q_HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(ROWS, LENGTH, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    # Each row sees its own prefix, and the last two rows only a window of 7 positions ending at theirs.
    positions = torch.tensor([0, 17, 39, 25])
    held = torch.arange(LENGTH)[None, :]
    visible = held <= positions[:, None]
    visible[2:] &= positions[2:, None] - held < 7
    return q.to(dtype), k.to(dtype), v.to(dtype), visible[:, None, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_one_query_attention_is_masked_sdpa(dtype, scale):
    q, k, v, visible = _inputs(dtype)
    reference = masked_attention(q.double(), k.double(), v.double(), visible, scale)
    got = one_query_attention(q, k, v, visible, scale)
    assert got.dtype == dtype and got.shape == q.shape
    assert_close("model_logits", got, reference, dtype)
    # Heads map to k/v heads as SDPA's grouped-query rule has it (query head h reads k/v head h // 3): a
    # different grouping would attend the same rows with other keys.
    swapped = one_query_attention(q, k.flip(2), v.flip(2), visible, scale)
    assert (swapped.double() - reference).abs().max() > 0.1


@pytest.mark.inductor
def test_compiled_one_query_attention_is_the_eager_one():
    # The form is written for inductor: compiled with it, the fused loops give the eager ops' result.
    q, k, v, visible = _inputs(torch.float32)
    compiled = torch.compile(one_query_attention, backend="inductor", dynamic=False)
    assert_close("model_logits", compiled(q, k, v, visible, None), masked_attention(q.double(), k.double(), v.double(), visible), torch.float32)
