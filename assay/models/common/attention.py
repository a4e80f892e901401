"""Causal attention (the kernel seam CausalAttention, kernel "attention") and the static KV cache's
prefill write and one-token decode attention."""

from __future__ import annotations

from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import nn


class CausalAttention(nn.Module):
    """Causal softmax attention over [B, T, H, D]; grouped-query (fewer k/v heads) handled by SDPA."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
        )
        return attended.transpose(1, 2)


# Per layer (k, v), each [n_rows, max_len, n_kv_heads, head_dim]: one row per serving slot.
KVCache: TypeAlias = list[tuple[torch.Tensor, torch.Tensor]]


def write_prefill_kv(cache: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor, slot_ids: torch.Tensor) -> None:
    # k, v: [B, T, Hkv, D] -> positions 0..T-1 of cache rows slot_ids
    cache_k, cache_v = cache
    seq_len = k.shape[1]
    cache_k[slot_ids, :seq_len] = k.to(cache_k.dtype)
    cache_v[slot_ids, :seq_len] = v.to(cache_v.dtype)


def cached_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
    slot_ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
) -> torch.Tensor:
    """One new token per row against its static cache row.

    q: [W, 1, Hq, D]; k, v: [W, 1, Hkv, D] (rotated); cache k, v: [N, S, Hkv, D]; slot_ids, positions: [W];
    visible: [W, 1, 1, S] bool -> attended [W, 1, Hq, D]
    """
    cache_k, cache_v = cache
    # In place (index_put_ on the graph input): the cache stays one static buffer, no recompiles.
    cache_k.index_put_((slot_ids, positions), k[:, 0].to(cache_k.dtype))
    cache_v.index_put_((slot_ids, positions), v[:, 0].to(cache_v.dtype))
    keys, values = cache_k[slot_ids].to(q.dtype), cache_v[slot_ids].to(q.dtype)  # [W, S, Hkv, D]
    attended = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible,
        enable_gqa=q.shape[2] != keys.shape[2],
    )
    return attended.transpose(1, 2)
