"""The native Qwen3, dense and mixture-of-experts, top to bottom: RMSNorm, rotary, Attention, MLP, MoE,
Block, Qwen3.

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

from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

from assay.core.errors import AssayError
from assay.models.qwen3.args import Qwen3Args


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        # Normalise in float32, cast back, then scale: Transformers' order, so bf16 rounding matches too.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rotary_cos_sin(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_seq_len, head_dim], float32, each frequency repeated in both halves (HF layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    positions = torch.arange(max_seq_len, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary at per-row positions. q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [B, T, D] (float32)."""
    cos = cos[:, :, None, :].to(q.dtype)
    sin = sin[:, :, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# Per layer (k, v), each [n_rows, max_len, n_kv_heads, head_dim]: one row per serving slot.
KVCache: TypeAlias = list[tuple[torch.Tensor, torch.Tensor]]


class RotaryEmbedding(nn.Module):
    """Applies the rotary embedding; the cos/sin cache lives on the Qwen3 root (one copy for all layers)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [T, D]
        cos = cos[None, :, None, :].to(q.dtype)
        sin = sin[None, :, None, :].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class CausalAttention(nn.Module):
    """Causal softmax attention over [B, T, H, D]; grouped-query (fewer k/v heads) handled by SDPA."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
        )
        return attended.transpose(1, 2)


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
        cache_k, cache_v = cache
        cache_k[slot_ids, :seq_len] = k.to(cache_k.dtype)
        cache_v[slot_ids, :seq_len] = v.to(cache_v.dtype)
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
        cache_k, cache_v = cache
        # In place (index_put_ on the graph input): the cache stays one static buffer, no recompiles.
        cache_k.index_put_((slot_ids, positions), k[:, 0].to(cache_k.dtype))
        cache_v.index_put_((slot_ids, positions), v[:, 0].to(cache_v.dtype))
        keys, values = cache_k[slot_ids].to(q.dtype), cache_v[slot_ids].to(q.dtype)  # [W, S, Hkv, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible,
            enable_gqa=q.shape[2] != keys.shape[2],
        )
        return self.wo(attended.transpose(1, 2).reshape(width, 1, -1))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """n_experts SwiGLU MLPs stored stacked; each slice [e] is an nn.Linear weight (out, in).

    This implementation loops over the experts that received tokens: plain PyTorch, correct for any
    routing, and the reference a grouped-GEMM kernel is checked against.
    """

    def __init__(self, n_experts: int, dim: int, hidden_dim: int):
        super().__init__()
        self.n_experts = n_experts
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))  # gate projection
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))  # down projection
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))  # up projection

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # x: [N, dim]; top_k_index, top_k_weights: [N, top_k] -> [N, dim]
        combined = torch.zeros_like(x)
        # Which (token, slot) pairs chose each expert; one host sync to learn which experts are used.
        expert_mask = F.one_hot(top_k_index, num_classes=self.n_experts).permute(2, 0, 1)  # [E, N, top_k]
        used_experts = expert_mask.flatten(1).any(dim=1).nonzero().flatten().tolist()
        for expert in used_experts:
            token_index, slot = torch.where(expert_mask[expert])
            tokens = x[token_index]
            hidden = F.silu(F.linear(tokens, self.w1[expert])) * F.linear(tokens, self.w3[expert])
            expert_out = F.linear(hidden, self.w2[expert]) * top_k_weights[token_index, slot, None]
            combined.index_add_(0, token_index, expert_out.to(combined.dtype))
        return combined


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


class Qwen3(nn.Module):
    def __init__(self, args: Qwen3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, layer_id) for layer_id in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        # Non-persistent: derived from the spec, never in a checkpoint. float32 here; cast at use.
        cos, sin = rotary_cos_sin(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding with the output head (again after load_state_dict(assign=True) or to_empty)."""
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def reset_rope_cache(self) -> None:
        """Recompute cos/sin on the embedding's device (a model built on the meta device has none)."""
        device = self.tok_embeddings.weight.device
        cos, sin = rotary_cos_sin(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, device=device)
        self.rope_cos, self.rope_sin = cos, sin

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Random initialisation as Transformers does it: normal(0, std) matrices, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, GroupedExperts):
                for weight in (module.w1, module.w2, module.w3):
                    weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        self.reset_rope_cache()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> logits: [B, T, vocab]
        seq_len = tokens.shape[1]
        if seq_len > self.rope_cos.shape[0]:
            raise AssayError(f"a sequence of {seq_len} tokens exceeds the model's max_seq_len={self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.output(self.norm(h))

    # ---------------------------------------------------------------- KV-cache decoding

    def init_kv_cache(self, n_rows: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A zeroed static cache: per layer (k, v), each [n_rows, max_len, n_kv_heads, head_dim].

        Static (allocated once, written in place): a compiled decode_step sees the same shapes every
        token; a growing cache would recompile at every length.
        """
        if n_rows < 1 or max_len < 1:
            raise AssayError(f"a KV cache needs n_rows >= 1 and max_len >= 1, got {n_rows} and {max_len}")
        if max_len > self.rope_cos.shape[0]:
            raise AssayError(f"KV cache max_len={max_len} exceeds the model's max_seq_len={self.rope_cos.shape[0]}")
        weight = self.tok_embeddings.weight
        dtype = dtype or weight.dtype
        shape = (n_rows, max_len, self.args.n_kv_heads, self.args.head_dim)
        return [
            (torch.zeros(shape, dtype=dtype, device=weight.device), torch.zeros(shape, dtype=dtype, device=weight.device))
            for _ in self.layers
        ]

    def prefill(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T]; slot_ids: [B] int64 -> logits: [B, T, vocab]; writes positions 0..T-1 of rows slot_ids
        seq_len = tokens.shape[1]
        max_len = kv_cache[0][0].shape[1]
        if seq_len > max_len:
            raise AssayError(f"a prompt of {seq_len} tokens exceeds the KV cache length {max_len}")
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for block, cache in zip(self.layers, kv_cache):
            h = h + block.attention.prefill(block.attention_norm(h), cos, sin, cache, slot_ids)
            h = block.feed_forward(h)
        return self.output(self.norm(h))

    def decode_step(
        self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        # tokens: [W, 1]; slot_ids, positions: [W] int64 -> logits: [W, 1, vocab]
        # Row w's new k/v go to position positions[w] of cache row slot_ids[w]; it attends to 0..positions[w].
        # positions is a tensor, never a Python int, so a compiled step does not specialise on the length.
        max_len = kv_cache[0][0].shape[1]
        cos, sin = self.rope_cos[positions][:, None, :], self.rope_sin[positions][:, None, :]  # [W, 1, D]
        span = torch.arange(max_len, device=positions.device)
        visible = (span[None, :] <= positions[:, None])[:, None, None, :]  # [W, 1, 1, S]
        h = self.tok_embeddings(tokens)
        for block, cache in zip(self.layers, kv_cache):
            h = h + block.attention.decode(block.attention_norm(h), cos, sin, cache, slot_ids, positions, visible)
            h = block.feed_forward(h)
        return self.output(self.norm(h))


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter once (a tied embedding/output counts once)
    embedding: int  # the token embedding table (a lookup, not a matmul)
    active_matmul: int  # matmul weights one token passes: attention, MLP or router + top_k experts, output head


def count_parameters(model: Qwen3) -> ParamCounts:
    """Parameter counts for the MFU formula (assay.core.metrics.train_flops_per_token takes active_matmul).

    Works on the meta device, so a 235B spec is counted without allocating it.
    """
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    embedding = model.tok_embeddings.weight.numel()
    active = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            active += module.weight.numel()  # includes the output head even when tied to the embedding
        elif isinstance(module, GroupedExperts):
            per_expert = (module.w1.numel() + module.w2.numel() + module.w3.numel()) // module.n_experts
            active += per_expert * model.args.top_k
    return ParamCounts(total=total, embedding=embedding, active_matmul=active)
