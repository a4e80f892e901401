"""The native Qwen3, dense and mixture-of-experts, top to bottom: Attention, MoE, Block, Qwen3. RMSNorm,
rotary, the SwiGLU MLP, the grouped experts and the KV-cache decoding loop are shared (assay.models.layers).

Weights are interchangeable with Transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM through
state_dict_adapter.py: the rotary uses HF's rotate-half convention and every normalisation and
routing step runs in the same dtype order as Transformers, so float32 logits agree to rounding.

Kernel seams: a replacement registry swaps modules by name, never code in this file.
  layers.{i}.attention.rope      RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]
  layers.{i}.attention.sdpa      CausalAttention   (q, k, v) -> out, [B, T, H, D]
  layers.{i}.moe.experts         GroupedExperts    (x, top_k_index, top_k_weights) -> out; holds w1/w2/w3
  layers.{i}.moe / .mlp / .attention              the whole block, same signature as below
A replacement for GroupedExperts should subclass it (or take over its parameters) so the state-dict
keys stay `layers.{i}.moe.experts.w1` etc.

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
Attention infers its local head count from the projected width, so column-sharded wq/wk/wv work as is.

KV-cache decoding (gpt-fast style, for the serving engine): a static cache of n_rows slots, each
max_len positions long, allocated once by init_kv_cache. prefill() fills positions 0..T-1 of the
given rows and goes through the rope/sdpa seams exactly as forward() does (so its logits are
forward()'s); decode_step() appends one token per row at that row's own position with plain ops
(a per-row rotary and a masked SDPA over the whole static row), because the seams' signatures
assume one shared position range and no cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from assay.models.layers import (
    MLP,
    CausalAttention,
    GroupedExperts,
    KVCache,
    RotaryDecoder,
    ParamCounts,
    RMSNorm,
    RotaryEmbedding,
    apply_rotary,
    cached_decode_attention,
    rotary_cos_sin,
    rotate_half,
    write_prefill_kv,
)
from assay.models.layers import count_parameters as count_layer_parameters
from assay.models.qwen3.args import Qwen3Args

# Shared layers, importable from here as before (assay.models.layers is their home).
__all__ = [
    "MLP", "Attention", "Block", "CausalAttention", "GroupedExperts", "KVCache", "MoE", "ParamCounts", "Qwen3",
    "RMSNorm", "RotaryEmbedding", "apply_rotary", "count_parameters", "rotary_cos_sin", "rotate_half",
]


class Attention(nn.Module):
    def __init__(self, args: Qwen3Args):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        # Qwen3 normalises each head's q and k before the rotary (weights of size head_dim).
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else nn.Identity()
        self.rope = RotaryEmbedding()
        self.sdpa = CausalAttention()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = self.rope(q, k, cos, sin)
        attended = self.sdpa(q, k, v)
        return self.wo(attended.reshape(batch, seq_len, -1))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, T, dim] -> q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (normalised, before the rotary)
        batch, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism the projections are column-sharded and hold local heads only.
        q = self.q_norm(self.wq(x).view(batch, seq_len, -1, self.head_dim))
        k = self.k_norm(self.wk(x).view(batch, seq_len, -1, self.head_dim))
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        return q, k, v

    def prefill(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], slot_ids: torch.Tensor
    ) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim]; cache k, v: [N, S, Hkv, D]; slot_ids: [B] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = self.rope(q, k, cos, sin)  # the seams, as in forward(): prefill attends only to its own tokens
        write_prefill_kv(cache, k, v, slot_ids)
        attended = self.sdpa(q, k, v)
        return self.wo(attended.reshape(batch, seq_len, -1))

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        slot_ids: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        # x: [W, 1, dim]; cos, sin: [W, 1, head_dim]; cache k, v: [N, S, Hkv, D]; slot_ids, positions: [W];
        # visible: [W, 1, 1, S] bool (position s <= positions[w]) -> [W, 1, dim]
        width = x.shape[0]
        q, k, v = self.project_qkv(x)
        q, k = apply_rotary(q, k, cos, sin)  # plain ops: each row has its own position
        attended = cached_decode_attention(q, k, v, cache, slot_ids, positions, visible)
        return self.wo(attended.reshape(width, 1, -1))


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


class Block(nn.Module):
    def __init__(self, args: Qwen3Args, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.is_moe = args.is_moe_layer(layer_id)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        if self.is_moe:
            self.moe = MoE(args)
        else:
            self.mlp = MLP(args.dim, args.hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return self.feed_forward(h)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:  # h: [B, T, dim] -> [B, T, dim]
        feed_forward = self.moe if self.is_moe else self.mlp
        return h + feed_forward(self.ffn_norm(h))


class Qwen3(RotaryDecoder):
    def __init__(self, args: Qwen3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, layer_id) for layer_id in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        self.init_rope_cache()


def count_parameters(model: Qwen3) -> ParamCounts:
    """Parameter counts for the MFU formula; works on the meta device (a 235B spec is never allocated)."""
    return count_layer_parameters(model, top_k=model.args.top_k)
