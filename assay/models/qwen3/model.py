"""The native Qwen3, dense and mixture-of-experts: only what makes a Qwen3. Attention with per-head q/k
RMSNorm and no biases, the SwiGLU MLP or the MoE (router + grouped experts) per layer, TransformerBlock's
wiring and RotaryDecoder's root are the shared layers (assay.models.common).

Weights are interchangeable with Transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM through
key_map.py: the rotary uses HF's rotate-half convention and every normalisation and
routing step runs in the same dtype order as Transformers, so float32 logits agree to rounding.

Kernel seams: a replacement registry swaps modules by name, never code in this file.
  layers.{i}.attention.rope      RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]
  layers.{i}.attention.sdpa      CausalAttention   (q, k, v) -> out, [B, T, H, D]
  layers.{i}.moe.experts         GroupedExperts    (x, top_k_index, top_k_weights) -> out; holds w1/w2/w3
A replacement for GroupedExperts should subclass it (or take over its parameters) so the state-dict
keys stay `layers.{i}.moe.experts.w1` etc.

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from assay.models.common.attention import Attention, CausalAttention
from assay.models.common.block import TransformerBlock
from assay.models.common.counting import ParamCounts, count_parameters
from assay.models.common.decoder import RotaryDecoder
from assay.models.common.feed_forward import MLP, GroupedExperts
from assay.models.common.rope import RotaryEmbedding
from assay.models.qwen3.args import Qwen3Args

__all__ = [
    "Attention", "Block", "CausalAttention", "GroupedExperts", "MoE", "ParamCounts", "Qwen3", "RotaryEmbedding", "count_parameters",
    ]


class MoE(nn.Module):
    """Router (linear -> softmax in float32 -> top-k -> optional renormalise) and the grouped experts."""

    def __init__(self, args: Qwen3Args):
        super().__init__()
        self.top_k = args.top_k
        self.norm_topk_prob = args.norm_topk_prob
        self.router = nn.Linear(args.dim, args.n_experts, bias=False)
        self.experts = GroupedExperts(args.n_experts, args.dim, args.moe_hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, dim] -> [B, T, dim]
        batch, seq_len, dim = x.shape
        tokens = x.reshape(-1, dim)
        router_logits = self.router(tokens)  # [N, E]
        probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_k_weights, top_k_index = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        combined = self.experts(tokens, top_k_index, top_k_weights.to(x.dtype))
        return combined.reshape(batch, seq_len, dim)


class Block(TransformerBlock):
    """Attention with per-head q/k norms, then the SwiGLU MLP, or the MoE on an expert layer."""

    def __init__(self, args: Qwen3Args, layer_id: int):
        is_moe = args.is_moe_layer(layer_id)
        attention = Attention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qk_norm_eps=args.norm_eps if args.qk_norm else None)
        feed_forward = MoE(args) if is_moe else MLP(args.dim, args.hidden_dim)
        super().__init__(layer_id, args.dim, args.norm_eps, attention, feed_forward, ffn_name="moe" if is_moe else "mlp")
        self.is_moe = is_moe


class Qwen3(RotaryDecoder):
    def __init__(self, args: Qwen3Args):
        super().__init__(args, Block)
