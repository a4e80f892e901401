"""The native Llama (Llama 2/3, SmolLM2, Mistral-dense): only what makes a Llama. The shared layers
(assay.models.common) do the rest: Attention without q/k norms and with optional projection biases, the
SwiGLU MLP (optional biases), TransformerBlock's pre-norm wiring, RotaryDecoder's root (rotary table with
Llama 3's frequency scaling, tied or untied head, KV-cache decoding). Weights are interchangeable with
Transformers' LlamaForCausalLM through key_map.py, and float32 logits agree to rounding.

Kernel seams (a replacement registry swaps modules by name, never code in this file):
  layers.{i}.attention.rope      RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]
  layers.{i}.attention.sdpa      CausalAttention   (q, k, v) -> out, [B, T, H, D]

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
"""

from __future__ import annotations

from assay.models.common.attention import Attention
from assay.models.common.block import TransformerBlock
from assay.models.common.counting import ParamCounts, count_parameters
from assay.models.common.decoder import RotaryDecoder
from assay.models.common.feed_forward import MLP
from assay.models.llama.args import LlamaArgs

__all__ = ["Attention", "Llama", "ParamCounts", "count_parameters", "Block"]


class Block(TransformerBlock):
    """Attention without q/k norms, then the SwiGLU MLP; projection biases as the args say."""

    def __init__(self, args: LlamaArgs, layer_id: int):
        attention = Attention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim, bias=args.attention_bias)
        super().__init__(layer_id, args.dim, args.norm_eps, attention, MLP(args.dim, args.hidden_dim, bias=args.mlp_bias))


class Llama(RotaryDecoder):
    def __init__(self, args: LlamaArgs):
        super().__init__(args, Block)
