"""GLAConfig: the Transformers config class for model_type "gla" (fla's GLAConfig fields), so
AutoConfig reads a GLA checkpoint's config.json. No torch here: registering the config is cheap.
"""

from __future__ import annotations

from transformers import PreTrainedConfig


class GLAConfig(PreTrainedConfig):
    """fla's GLAConfig fields (those assay.models.gla.GLAArgs reads); others are kept as attributes."""

    model_type = "gla"
    keys_to_ignore_at_inference = ["cache"]

    vocab_size: int = 32000
    hidden_size: int = 2048
    num_hidden_layers: int = 24
    num_heads: int = 4
    num_kv_heads: int | None = None
    expand_k: float = 0.5
    expand_v: float = 1.0
    hidden_ratio: int | None = 4
    intermediate_size: int | None = None
    gate_low_rank_dim: int = 16
    gate_logit_normalizer: float = 16.0
    clamp_min: float | None = None
    use_output_gate: bool = True
    hidden_act: str = "swish"
    attn_mode: str = "chunk"
    use_gk: bool = True
    use_gv: bool = False
    use_short_conv: bool = False
    conv_size: int = 4
    conv_bias: bool = False
    feature_map: str | None = None
    attn: dict | None = None
    elementwise_affine: bool = True
    norm_eps: float = 1e-6
    fuse_norm: bool = True
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2

    @property
    def layer_types(self) -> list[str]:
        # Every layer keeps a fixed-size recurrent state: Transformers' caches then hold one state per
        # layer (LinearAttentionLayer), never keys and values.
        return ["linear_attention"] * self.num_hidden_layers


__all__ = ["GLAConfig"]
