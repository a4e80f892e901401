"""TransformerBlock: the residual wiring of a pre-norm decoder block, written once for training, batched
prefill into a KV cache and one-token decode, with optional post-norms on both branches (Gemma's sandwich).

    h   = x + post_attention_norm(attention(attention_norm(x)))
    out = h + post_ffn_norm(feed_forward(ffn_norm(h)))          (post-norms: identity when absent)

The feed-forward module keeps the name the architecture's checkpoint map uses (`mlp`, or `moe` for a
Qwen3 expert layer), so state-dict keys and kernel targets stay `layers.{i}.mlp.w1`, `layers.{i}.moe.experts`.
"""

from __future__ import annotations

import torch
from torch import nn

from assay.models.common.attention import Attention
from assay.models.common.norm import RMSNorm


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, dim: int, norm_eps: float, attention: Attention, feed_forward: nn.Module, *,
                 ffn_name: str = "mlp", sandwich: bool = False, unit_offset: bool = False, rope_kind: int = 0):
        super().__init__()
        self.layer_id = layer_id
        self.rope_kind = rope_kind  # which of the root's rotary tables this layer reads
        self.ffn_name = ffn_name
        self.attention_norm = RMSNorm(dim, norm_eps, unit_offset)
        self.attention = attention
        self.post_attention_norm = RMSNorm(dim, norm_eps, unit_offset) if sandwich else None
        self.ffn_norm = RMSNorm(dim, norm_eps, unit_offset)
        setattr(self, ffn_name, feed_forward)
        self.post_ffn_norm = RMSNorm(dim, norm_eps, unit_offset) if sandwich else None

    @property
    def feed_forward(self) -> nn.Module:
        return getattr(self, self.ffn_name)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        return self._residual(x, self.attention(self.attention_norm(x), cos, sin))

    def prefill(self, x: torch.Tensor, step) -> torch.Tensor:
        # x: [B, T, dim]; step: a kv_cache.PrefillStep -> [B, T, dim]
        return self._residual(x, self.attention.prefill(self.attention_norm(x), step))

    def decode(self, x: torch.Tensor, step) -> torch.Tensor:
        # x: [W, 1, dim]; step: a kv_cache.DecodeStep -> [W, 1, dim]
        return self._residual(x, self.attention.decode(self.attention_norm(x), step))

    def _residual(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        if self.post_attention_norm is not None:
            attended = self.post_attention_norm(attended)
        h = x + attended
        out = self.feed_forward(self.ffn_norm(h))
        if self.post_ffn_norm is not None:
            out = self.post_ffn_norm(out)
        return h + out
