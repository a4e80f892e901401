"""Softmax attention: the kernel seam CausalAttention (kernel "attention"), WindowedCausalAttention (a
window or a query scale: what that kernel does not do), masked attention over a KV cache, and Attention,
the q/k/v/o layer every softmax-attention model here builds with switches (projection biases, per-head
q/k norms, window, scale).

Three ways through one Attention:
  forward(x, cos, sin)         training: the rope and sdpa seams over the sequence
  prefill(x, step)             a right-padded batch of prompts (or later chunks) into KV-cache rows
  decode(x, step)              one token per row at that row's own position
The steps (assay.models.common.kv_cache) carry the rotary rows, the cache, the rows' slots and masks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from assay.models.common.norm import RMSNorm
from assay.models.common.rope import RotaryEmbedding, apply_rotary

if TYPE_CHECKING:
    from assay.models.common.kv_cache import DecodeStep, PrefillStep


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """q: [B, Tq, Hq, D]; k, v: [B, Tk, Hkv, D]; mask: [B or 1, 1, Tq, Tk] bool (True: visible) -> [B, Tq, Hq, D].
    scale None: head_dim ** -0.5."""
    attended = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
    )
    return attended.transpose(1, 2)


def one_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """masked_attention for one query per row, in plain ops, for a compiled decode step: inductor fuses the key
    gather, scores, softmax and value sum into a few loops over the cache, where SDPA is an opaque call
    with a per-call cost (on a 2-core x86 CPU, one sequence of SmolLM2-135M over a 256-position cache: a
    compiled step of 26.1 ms with SDPA, 23.3 ms with this). Eager, it would build [W, Hkv, g, L, D]
    products: decode eagerly through masked_attention. Computed in float32 whatever q's dtype.
    q: [W, 1, Hq, D]; k, v: [W, L, Hkv, D]; mask: [W, 1, 1, L] bool -> [W, 1, Hq, D]."""
    rows, _, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    grouped = q.float().view(rows, kv_heads, q_heads // kv_heads, 1, head_dim)  # [W, Hkv, g, 1, D]: g query heads per k/v head
    keys = k.float().permute(0, 2, 1, 3)[:, :, None]  # [W, Hkv, 1, L, D]
    values = v.float().permute(0, 2, 1, 3)[:, :, None]
    scores = (grouped * keys).sum(-1) * scale  # [W, Hkv, g, L]
    scores = scores.masked_fill(~mask.view(rows, 1, 1, -1), float("-inf"))
    attended = (scores.softmax(-1)[..., None] * values).sum(-2)  # [W, Hkv, g, D]
    return attended.reshape(rows, 1, q_heads, head_dim).to(q.dtype)


def causal_window_mask(seq_len: int, window: int | None, device) -> torch.Tensor:
    """[T, T] bool: query t sees keys t' <= t, and with a window only t - t' < window (Transformers' rule)."""
    span = torch.arange(seq_len, device=device)
    offset = span[:, None] - span[None, :]
    visible = offset >= 0
    return visible & (offset < window) if window is not None else visible


class CausalAttention(nn.Module):
    """Causal softmax attention over [B, T, H, D]; grouped-query (fewer k/v heads) handled by SDPA."""

    scale: float | None = None  # what the masked (cached) paths use: head_dim ** -0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
        )
        return attended.transpose(1, 2)


class WindowedCausalAttention(nn.Module):
    """Causal attention with a sliding window (each token sees itself and window - 1 predecessors) and/or
    a query scale other than head_dim ** -0.5. Not a CausalAttention: the "attention" kernel implements
    neither, so it never replaces this module."""

    def __init__(self, window: int | None = None, scale: float | None = None):
        super().__init__()
        self.window, self.scale = window, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        if self.window is None:
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=self.scale,
                enable_gqa=q.shape[2] != k.shape[2],
            )
            return attended.transpose(1, 2)
        mask = causal_window_mask(q.shape[1], self.window, q.device)[None, None]
        return masked_attention(q, k, v, mask, self.scale)

    def extra_repr(self) -> str:
        return f"window={self.window}, scale={self.scale}"


class Attention(nn.Module):
    """q/k/v/o projections, optional per-head q/k RMSNorm before the rotary (Qwen3, Gemma 3), the rotary
    seam `rope` and the attention seam `sdpa`.

    Switches: bias (q, k, v, o projections), qk_norm_eps (None: no q/k norm), unit_offset (Gemma's
    1 + weight norms), window (sliding-window layer), scale (None: head_dim ** -0.5).
    The local head count is inferred from the projected width, so column-sharded wq/wk/wv work as is.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, *, bias: bool = False,
                 qk_norm_eps: float | None = None, unit_offset: bool = False, window: int | None = None,
                 scale: float | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.window = window
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=bias)
        # One weight of size head_dim each, shared by every head.
        self.q_norm = RMSNorm(head_dim, qk_norm_eps, unit_offset) if qk_norm_eps is not None else nn.Identity()
        self.k_norm = RMSNorm(head_dim, qk_norm_eps, unit_offset) if qk_norm_eps is not None else nn.Identity()
        self.rope = RotaryEmbedding()
        self.sdpa = CausalAttention() if window is None and scale is None else WindowedCausalAttention(window, scale)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, T, dim] -> q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (q, k normalised, before the rotary)
        batch, seq_len, _ = x.shape
        q = self.q_norm(self.wq(x).view(batch, seq_len, -1, self.head_dim))
        k = self.k_norm(self.wk(x).view(batch, seq_len, -1, self.head_dim))
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = self.rope(q, k, cos, sin)
        return self.wo(self.sdpa(q, k, v).reshape(batch, seq_len, -1))

    def prefill(self, x: torch.Tensor, step: PrefillStep) -> torch.Tensor:
        # x: [B, T, dim] (rows right-padded) -> [B, T, dim]; the rows' real keys/values written to their cache rows
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        if step.mask is None:
            # Fresh sequences: the seams exactly as forward() (so its logits are forward()'s); right padding
            # never reaches a real token through a causal mask.
            q, k = self.rope(q, k, step.cos, step.sin)
            attended = self.sdpa(q, k, v)
        else:
            # Later chunks: each row attends to its cached positions, then its chunk causally.
            q, k = apply_rotary(q, k, step.cos, step.sin)
            cached_k, cached_v = (part.index_select(0, step.slot_ids).to(q.dtype) for part in step.cache)  # [B, L, Hkv, D]
            keys, values = torch.cat([cached_k, k], dim=1), torch.cat([cached_v, v], dim=1)
            attended = masked_attention(q, keys, values, step.mask, self.sdpa.scale)
        step.write(k, v)
        return self.wo(attended.reshape(batch, seq_len, -1))

    def decode(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        # x: [W, 1, dim] -> [W, 1, dim]; row w's new k/v go to its slot at its position (mod the ring length)
        q, k, v = self.project_qkv(x)
        q, k = apply_rotary(q, k, step.cos, step.sin)  # plain ops: each row has its own position
        cache_k, cache_v = step.cache
        # In place (index_put_ on the graph input): the cache stays one static buffer, no recompiles.
        cache_k.index_put_((step.slot_ids, step.index), k[:, 0].to(cache_k.dtype))
        cache_v.index_put_((step.slot_ids, step.index), v[:, 0].to(cache_v.dtype))
        if step.groups is None:
            attended = self._attend_cached(q, cache_k, cache_v, step.slot_ids, step.visible)
        else:  # rows of different lengths: each group over the positions its rows hold (kv_cache.row_groups)
            attended = torch.empty_like(q)
            for group in step.groups:
                part = self._attend_cached(q.index_select(0, group.rows), cache_k[:, : group.live], cache_v[:, : group.live],
                                           group.slot_ids, group.visible)
                attended.index_copy_(0, group.rows, part)
        return self.wo(attended.reshape(x.shape[0], 1, -1))

    def _attend_cached(self, q, cache_k, cache_v, slot_ids, visible):
        # q: [W, 1, Hq, D]; cache_k/v: [N, L, Hkv, D]; slot_ids: [W]; visible: [W, 1, 1, L] -> [W, 1, Hq, D]
        # index_select, not cache_k[slot_ids]: the same rows, gathered 2-6x faster on CPU (advanced indexing
        # goes through the generic index kernel; measured at 8-32 rows x 160-2,176 positions).
        keys, values = cache_k.index_select(0, slot_ids).to(q.dtype), cache_v.index_select(0, slot_ids).to(q.dtype)  # [W, L, Hkv, D]
        attend = one_query_attention if torch.compiler.is_compiling() else masked_attention
        return attend(q, keys, values, visible, self.sdpa.scale)
