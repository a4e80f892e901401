"""The native Llama (Llama 2/3, SmolLM2, Mistral-dense), top to bottom: Attention, Block, Llama.

RMSNorm, rotary (with Llama 3's frequency scaling), the SwiGLU MLP and the KV-cache decoding loop are
the shared layers (assay.models.layers); this file holds only what makes a Llama: attention without
q/k normalisation, optional projection biases, tied or untied embeddings. Weights are interchangeable
with Transformers' LlamaForCausalLM through state_dict_adapter.py, and float32 logits agree to rounding.

Kernel seams (a replacement registry swaps modules by name, never code in this file):
  layers.{i}.attention.rope      RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]
  layers.{i}.attention.sdpa      CausalAttention   (q, k, v) -> out, [B, T, H, D]

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
Attention infers its local head count from the projected width, so column-sharded wq/wk/wv work as is.
"""

from __future__ import annotations

import torch
from torch import nn

from assay.models.layers import (
    MLP,
    CausalAttention,
    ParamCounts,
    RMSNorm,
    RotaryDecoder,
    RotaryEmbedding,
    apply_rotary,
    cached_decode_attention,
    write_prefill_kv,
)
from assay.models.layers import count_parameters as count_layer_parameters
from assay.models.llama.args import LlamaArgs


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim = args.head_dim
        bias = args.attention_bias
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=bias)
        self.rope = RotaryEmbedding()
        self.sdpa = CausalAttention()

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, T, dim] -> q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (-1 heads: local heads under TP)
        batch, seq_len, _ = x.shape
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = self.rope(q, k, cos, sin)
        return self.wo(self.sdpa(q, k, v).reshape(batch, seq_len, -1))

    def prefill(self, x, cos, sin, cache, slot_ids) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim]; cache k, v: [N, S, Hkv, D]; slot_ids: [B] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = self.rope(q, k, cos, sin)  # the seams, as in forward(): prefill attends only to its own tokens
        write_prefill_kv(cache, k, v, slot_ids)
        return self.wo(self.sdpa(q, k, v).reshape(batch, seq_len, -1))

    def decode(self, x, cos, sin, cache, slot_ids, positions, visible) -> torch.Tensor:
        # x: [W, 1, dim]; cos, sin: [W, 1, head_dim]; slot_ids, positions: [W]; visible: [W, 1, 1, S] -> [W, 1, dim]
        q, k, v = self.project_qkv(x)
        q, k = apply_rotary(q, k, cos, sin)  # plain ops: each row has its own position
        attended = cached_decode_attention(q, k, v, cache, slot_ids, positions, visible)
        return self.wo(attended.reshape(x.shape[0], 1, -1))


class Block(nn.Module):
    def __init__(self, args: LlamaArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args.dim, args.hidden_dim, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, T, dim]; cos, sin: [T, head_dim] -> [B, T, dim]
        return self.feed_forward(x + self.attention(self.attention_norm(x), cos, sin))

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:  # h: [B, T, dim] -> [B, T, dim]
        return h + self.mlp(self.ffn_norm(h))


class Llama(RotaryDecoder):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, layer_id) for layer_id in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        self.init_rope_cache()


def count_parameters(model: Llama) -> ParamCounts:
    """Parameter counts for the MFU formula; works on the meta device."""
    return count_layer_parameters(model)
