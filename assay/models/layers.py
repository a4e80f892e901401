"""Layers shared by every native model, and the kernel seams, re-exported from their modules in
assay.models.common (one per concern: norm, rope, attention, feed_forward, linear_attention, block,
kv_cache, decoder, counting). Import from either place.

The kernel registry (assay.kernels) targets the module classes here, never a model class, so a new
architecture that builds from these layers gets the kernels with no kernel change:
  RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]     kernel "rope"
  CausalAttention   (q, k, v) -> out, [B, T, H, D]                kernel "attention"
  GroupedExperts    (x, top_k_index, top_k_weights) -> out         kernel "grouped_experts"
  GLAOperator       (q, k, v, g, initial_state, output_final_state) kernel "gla_chunk"

Numerics follow Transformers (rotate-half rotary, float32 normalisation then cast, then scale) so a
native model's float32 logits equal Transformers' to rounding.
"""

from assay.models.common.attention import Attention, CausalAttention, WindowedCausalAttention, masked_attention
from assay.models.common.block import TransformerBlock
from assay.models.common.counting import ParamCounts, count_parameters
from assay.models.common.decoder import NativeDecoder, RotaryDecoder
from assay.models.common.feed_forward import MLP, GroupedExperts, grouped_mm_runs
from assay.models.common.kv_cache import KVCache, KVCacheDecodingMixin
from assay.models.common.linear_attention import GLAOperator, ShortConvolution
from assay.models.common.norm import RMSNorm
from assay.models.common.rope import (
    LinearRopeScaling,
    RopeScaling,
    RotaryEmbedding,
    apply_rotary,
    rotary_cos_sin,
    rotary_inv_freq,
    rotate_half,
)

__all__ = [
    "MLP", "Attention", "CausalAttention", "GLAOperator", "GroupedExperts", "KVCache", "KVCacheDecodingMixin",
    "LinearRopeScaling", "NativeDecoder", "ParamCounts", "RMSNorm", "RopeScaling", "RotaryDecoder", "RotaryEmbedding",
    "ShortConvolution", "TransformerBlock", "WindowedCausalAttention", "apply_rotary", "count_parameters", "grouped_mm_runs",
    "masked_attention", "rotary_cos_sin", "rotary_inv_freq", "rotate_half",
]
