"""GLAArgs: every size and switch of the native GLA causal LM, with defaults.

The layer is the one of the GLA reference design (Yang et al., "Gated Linear Attention Transformers
with Hardware-Efficient Training", and its implementation in flash-linear-attention, `fla`):
q/k at expand_k x dim, v and the output gate at expand_v x dim, a low-rank forget gate
(dim -> gate_low_rank_dim -> key_dim, logsigmoid divided by gate_logit_normalizer), a per-head
RMSNorm on the attention output times a swish output gate, then a SwiGLU MLP; pre-norm RMSNorm blocks.

The config.json form is fla's GLAConfig (model_type "gla", architectures ["GLAForCausalLM"]):
hidden_size, num_hidden_layers, num_heads, expand_k, expand_v, hidden_ratio / intermediate_size,
use_output_gate, norm_eps, fuse_norm, ... Transformers has no GLA; fla registers this config with it.
fla's GLABlock builds its layer with the layer's defaults for gate_low_rank_dim and
gate_logit_normalizer (16 and 16): we write both fields into config.json for readers that honour them
and read them back (defaulting to 16), so a spec that changes them is not one fla reproduces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from assay.core.errors import AssayError
from assay.models.common.args import ModelArgs

HF_MODEL_TYPE = "gla"
HF_ARCHITECTURE = "GLAForCausalLM"


def fla_intermediate_size(dim: int, hidden_ratio: int) -> int:
    """fla's GatedMLP rule when intermediate_size is null: 2/3 x hidden_ratio x dim, rounded up to 256."""
    size = int(dim * hidden_ratio * 2 / 3)
    return 256 * ((size + 256 - 1) // 256)


@dataclass(frozen=True, kw_only=True)
class GLAArgs(ModelArgs):
    expand_k: float = 0.5
    expand_v: float = 1.0
    hidden_ratio: int = 4
    hidden_dim: int = 0  # SwiGLU width; 0: fla's rule from hidden_ratio (resolved at construction)
    gate_low_rank_dim: int = 16
    gate_logit_normalizer: float = 16.0
    clamp_min: float | None = None  # lower bound of the log forget gate (None: unbounded)
    use_output_gate: bool = True
    max_seq_len: int = 2048  # max_position_embeddings: recorded only, GLA has no positional table
    # fla's fused norm+gate kernel names the per-head norm `g_norm_swish_gate` instead of `g_norm`;
    # same math, so here it decides only the key name written on export.
    fuse_norm: bool = False
    # Tokens per chunk of the chunkwise-parallel GLA (assay.ops.gla_chunk) in training and prefill.
    chunk_size: int = 64
    # fla's short convolutions: a causal depthwise convolution (+ SiLU) of conv_size taps on q, k and v
    # after their projections. Off by default (fla's default, and its published GLA checkpoints); the
    # recall probes turn it on (docs/recall.md). The decoding state then also keeps each layer's last
    # conv_size - 1 projected q, k, v.
    use_short_conv: bool = False
    conv_size: int = 4
    conv_bias: bool = False

    FAMILY: ClassVar[str] = "GLA"
    HF_MODEL_TYPES: ClassVar[tuple[str, ...]] = (HF_MODEL_TYPE,)
    ALIASES: ClassVar[Mapping[str, str]] = {**ModelArgs.ALIASES, "chunk": "chunk_size", "short_conv": "use_short_conv", "conv": "conv_size"}
    POSITIVE: ClassVar[tuple[str, ...]] = (*ModelArgs.POSITIVE, "gate_low_rank_dim")

    def __post_init__(self) -> None:
        if self.hidden_dim == 0 and self.hidden_ratio >= 1:
            object.__setattr__(self, "hidden_dim", fla_intermediate_size(self.dim, self.hidden_ratio))
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.expand_k <= 0 or self.expand_v <= 0:
            problems.append("expand_k and expand_v must be > 0")
        elif self.n_heads >= 1:
            if self.key_dim < 1 or self.key_dim % self.n_heads:
                problems.append(f"key_dim = dim x expand_k = {self.key_dim} is not a positive multiple of n_heads={self.n_heads}")
            if self.value_dim < 1 or self.value_dim % self.n_heads:
                problems.append(f"value_dim = dim x expand_v = {self.value_dim} is not a positive multiple of n_heads={self.n_heads}")
        if self.gate_logit_normalizer <= 0:
            problems.append("gate_logit_normalizer must be > 0")
        if self.clamp_min is not None and self.clamp_min >= 0:
            problems.append(f"clamp_min={self.clamp_min} must be < 0 (it bounds a log forget gate)")
        if self.use_short_conv and self.conv_size < 2:
            problems.append(f"conv_size={self.conv_size} must be >= 2 (a short convolution over at least two tokens)")
        if self.chunk_size < 16 or self.chunk_size > 128 or self.chunk_size % 16:
            problems.append(f"chunk_size={self.chunk_size} must be a multiple of 16 from 16 to 128")
        return problems

    @property
    def key_dim(self) -> int:  # q and k width over all heads
        return int(self.dim * self.expand_k)

    @property
    def value_dim(self) -> int:  # v and output-gate width over all heads
        return int(self.dim * self.expand_v)

    @property
    def conv_state_dim(self) -> int:  # the channels a layer's short-convolution state keeps: q, k and v
        return 2 * self.key_dim + self.value_dim

    @property
    def head_k_dim(self) -> int:
        return self.key_dim // self.n_heads

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.n_heads

    # ---------------------------------------------------------------- fla's config.json

    @classmethod
    def fields_from_hf(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """fla's GLAConfig fields (a config.json dict or a config object's to_dict())."""
        unsupported = {
            "use_gv": "a value gate (use_gv)",
            "feature_map": "a feature map on q and k",
            "attn": "hybrid softmax-attention layers",
        }
        for key, what in unsupported.items():
            if cfg.get(key):
                raise AssayError(f"config enables {what} ({key}={cfg[key]!r}); the native GLA does not implement it")
        if cfg.get("use_gk") is False:
            raise AssayError("config sets use_gk=false; the native GLA always has the key forget gate")
        if cfg.get("elementwise_affine") is False:
            raise AssayError("config sets elementwise_affine=false; the native GLA's per-head norm has a weight")
        if cfg.get("hidden_act", "swish") not in ("swish", "silu"):
            raise AssayError(f"config hidden_act is {cfg['hidden_act']!r}; the native GLA uses swish")
        n_heads = int(cfg.get("num_heads", 4))
        if cfg.get("num_kv_heads") not in (None, n_heads):
            raise AssayError(f"config has num_kv_heads={cfg['num_kv_heads']} < num_heads={n_heads}; the native GLA has no grouped heads")
        hidden_ratio = cfg.get("hidden_ratio")
        return dict(
            vocab_size=int(cfg["vocab_size"]),
            dim=int(cfg["hidden_size"]),
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads,
            expand_k=float(cfg.get("expand_k", 0.5)),
            expand_v=float(cfg.get("expand_v", 1.0)),
            hidden_ratio=int(hidden_ratio) if hidden_ratio is not None else 4,
            hidden_dim=int(cfg.get("intermediate_size") or 0),
            gate_low_rank_dim=int(cfg.get("gate_low_rank_dim") or 16),
            gate_logit_normalizer=float(cfg.get("gate_logit_normalizer") or 16),
            clamp_min=None if cfg.get("clamp_min") is None else float(cfg["clamp_min"]),
            use_output_gate=bool(cfg.get("use_output_gate", True)),
            # fla renamed rms_norm_eps to norm_eps; the published checkpoints carry one or both.
            norm_eps=float(cfg.get("norm_eps", cfg.get("rms_norm_eps", 1e-6))),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
            fuse_norm=bool(cfg.get("fuse_norm", True)),  # fla's default
            use_short_conv=bool(cfg.get("use_short_conv", False)),
            conv_size=int(cfg.get("conv_size") or 4),
            conv_bias=bool(cfg.get("conv_bias", False)),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that fla's GLAConfig / GLAForCausalLM reads."""
        return {
            "model_type": HF_MODEL_TYPE,
            "architectures": [HF_ARCHITECTURE],
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_heads": self.n_heads,
            "num_kv_heads": None,
            "expand_k": self.expand_k,
            "expand_v": self.expand_v,
            "hidden_ratio": self.hidden_ratio,
            "intermediate_size": self.hidden_dim,
            "gate_low_rank_dim": self.gate_low_rank_dim,
            "gate_logit_normalizer": self.gate_logit_normalizer,
            "clamp_min": self.clamp_min,
            "use_output_gate": self.use_output_gate,
            "hidden_act": "swish",
            "attn_mode": "chunk",
            "use_gk": True,
            "use_gv": False,
            "use_short_conv": self.use_short_conv,
            "conv_size": self.conv_size,
            "conv_bias": self.conv_bias,
            "feature_map": None,
            "attn": None,
            "elementwise_affine": True,
            "norm_eps": self.norm_eps,
            "fuse_norm": self.fuse_norm,
            "fuse_swiglu": True,
            "fuse_cross_entropy": True,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_seq_len,
            "initializer_range": 0.02,
            "use_cache": True,
        }

    @classmethod
    def resolve_overrides(cls, given: str | Mapping[str, Any]) -> dict[str, Any]:
        """A new dim or hidden_ratio without a new hidden_dim re-derives the SwiGLU width by fla's rule."""
        resolved = super().resolve_overrides(given)
        if ("dim" in resolved or "hidden_ratio" in resolved) and "hidden_dim" not in resolved:
            resolved["hidden_dim"] = 0
        return resolved
