"""The native Gemma 3 (text): only what makes a Gemma 3. From the shared layers (assay.models.common):
Attention with per-head q/k norms, a window on sliding layers and the scale query_pre_attn_scalar ** -0.5
(no attention soft-cap: Transformers' Gemma 3 applies none); the GeGLU MLP (tanh GELU); TransformerBlock with sandwich norms (four
per block); every RMSNorm Gemma's `1 + weight`, in float32; RotaryDecoder with two rotary tables (global
and local bases). Here: the embedding scaled by sqrt(dim) (rounded to the weights' dtype, as Transformers
does) and the optional final logit soft-cap.

Kernel seams: layers.{i}.attention.rope (RotaryEmbedding, kernel "rope"). A layer's attention is the
"attention" kernel's CausalAttention only when it has no window and the default scale
(WindowedCausalAttention otherwise: that kernel implements neither).

KV-cache decoding (KVCacheDecodingMixin): a sliding layer's cache is a ring of its window, so a slot holds
max_len positions for the global layers and `sliding_window` for the others.

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
"""

from __future__ import annotations

import torch

from assay.models.common.attention import Attention
from assay.models.common.block import TransformerBlock
from assay.models.common.counting import ParamCounts, count_parameters
from assay.models.common.decoder import RotaryDecoder
from assay.models.common.feed_forward import MLP
from assay.models.gemma3.args import Gemma3Args

__all__ = ["Block", "Gemma3", "ParamCounts", "count_parameters"]


class Block(TransformerBlock):
    def __init__(self, args: Gemma3Args, layer_id: int):
        attention = Attention(
            args.dim, args.n_heads, args.n_kv_heads, args.head_dim, bias=args.attention_bias, qk_norm_eps=args.norm_eps,
            unit_offset=True, window=args.layer_window(layer_id), scale=args.attention_scale,
        )
        mlp = MLP(args.dim, args.hidden_dim, activation=args.hidden_act)
        super().__init__(layer_id, args.dim, args.norm_eps, attention, mlp, sandwich=True, unit_offset=True,
                         rope_kind=args.rope_kind(layer_id))


class Gemma3(RotaryDecoder):
    def __init__(self, args: Gemma3Args):
        super().__init__(args, Block, unit_offset=True, logit_softcap=args.final_logit_softcapping)

    def init_buffers(self) -> None:
        super().init_buffers()
        # sqrt(dim) as Transformers keeps it: a float32 scalar, cast to the activations' dtype at use (55.5, not
        # 55.43, in bfloat16). Non-persistent: derived from the spec, never in a checkpoint.
        self.register_buffer("embed_scale", torch.tensor(self.args.dim**0.5), persistent=False)

    def reset_buffers(self) -> None:
        super().reset_buffers()
        self.embed_scale = torch.tensor(self.args.dim**0.5, device=self.tok_embeddings.weight.device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: [B, T] -> [B, T, dim]
        h = self.tok_embeddings(tokens)
        return h * self.embed_scale.to(h.dtype)
