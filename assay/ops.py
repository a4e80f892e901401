"""The public functional operators: gated linear attention (GLA) with a fixed signature and contract.

These three functions are what code outside assay calls (docs/gla.md); their signatures and return
shapes stay as written here while the implementations in assay.kernels.gla change. Layout, as for every
attention-like op in assay: [batch, time, heads, dim].

    q, k, g: [B, T, H, K]   g: log forget gate per key channel, <= 0 (e.g. logsigmoid(x) / 16)
    v:       [B, T, H, V]
    state:   [B, H, K, V], accumulated in float32 (float64 for float64 inputs) whatever the input dtype
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t ;   o_t = (q_t * scale) S_t,  scale = K**-0.5 by default

Bad shapes or a chunk size outside 16, 32, ..., 128 raise AssayError with the shapes received (the
checks run in the implementations, which assay's own kernels also call directly).
"""

from __future__ import annotations

import torch

from assay.kernels.gla.chunk import gla_chunk as _chunked
from assay.kernels.gla.reference import gla_recurrent as _recurrent
from assay.kernels.gla.reference import gla_step as _step


def gla_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float | None = None,
              initial_state: torch.Tensor | None = None, output_final_state: bool = False,
              chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise-parallel GLA (training and prefill): equal to `gla_recurrent` within the ("recurrence",
    dtype) tolerance of assay.core.numerics, with a written-out backward that keeps O(T K) per head.

    Returns (o [B, T, H, V] in q's dtype, final_state [B, H, K, V] in the accumulation dtype, or None
    unless output_final_state). T need not be a multiple of chunk_size.
    """
    return _chunked(q, k, v, g, scale, initial_state, output_final_state, chunk_size)


def gla_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float | None = None,
                  initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference: one `gla_step` per token. Returns (o [B, T, H, V] in q's dtype, final_state
    [B, H, K, V] in the accumulation dtype, or None unless output_final_state)."""
    return _recurrent(q, k, v, g, scale, initial_state, output_final_state)


def gla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, state: torch.Tensor,
             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: q, k, g [B, H, K], v [B, H, V], state [B, H, K, V] -> (o [B, H, V] in q's dtype,
    new_state [B, H, K, V] in the accumulation dtype)."""
    return _step(q, k, v, g, state, scale)


__all__ = ["gla_chunk", "gla_recurrent", "gla_step"]
