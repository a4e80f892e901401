"""LlamaArgs: every size and switch of the native Llama (Llama 2/3, SmolLM2, Mistral-dense), with defaults.

Sizes are data: a flavour is one LlamaArgs, an override is `dataclasses.replace`. The same spec converts
to and from a Transformers LlamaConfig, so a checkpoint's config.json decides the architecture and an
export reloads with AutoModelForCausalLM. Mistral's config (model_type "mistral") is the same layout
when its sliding window does not bind; the export writes the model_type it was read from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from assay.core.errors import AssayError
from assay.models import spec
from assay.models.layers import RopeScaling

HF_MODEL_TYPES = ("llama", "mistral")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # SwiGLU width
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False  # q, k, v and o projections (Transformers' attention_bias)
    mlp_bias: bool = False  # gate, up and down projections
    # Rotary scaling: "default" (none) or "llama3" (Llama 3.1+: long wavelengths stretched by rope_factor).
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    hf_model_type: str = "llama"  # what the export writes back: "llama" or "mistral"

    def __post_init__(self) -> None:
        problems = []
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.n_kv_heads >= 1 and self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            problems.append("norm_eps and rope_theta must be > 0")
        if self.rope_type not in ROPE_TYPES:
            problems.append(f"rope_type={self.rope_type!r} must be one of {', '.join(ROPE_TYPES)}")
        if self.rope_type == "llama3" and (self.rope_factor <= 0 or self.rope_high_freq_factor <= self.rope_low_freq_factor):
            problems.append("llama3 rope scaling needs rope_factor > 0 and rope_high_freq_factor > rope_low_freq_factor")
        if self.hf_model_type not in HF_MODEL_TYPES:
            problems.append(f"hf_model_type={self.hf_model_type!r} must be one of {', '.join(HF_MODEL_TYPES)}")
        if problems:
            raise AssayError("invalid Llama spec: " + "; ".join(problems))

    @property
    def rope_scaling(self) -> RopeScaling | None:
        if self.rope_type != "llama3":
            return None
        return RopeScaling(self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_max_len)

    # ---------------------------------------------------------------- Transformers config

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> LlamaArgs:
        """From a config.json dict or a Transformers LlamaConfig / MistralConfig (no `architectures` needed)."""
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        model_type = cfg.get("model_type")
        if model_type not in HF_MODEL_TYPES:
            raise AssayError(f"config model_type is {model_type!r}; the native Llama reads {' or '.join(map(repr, HF_MODEL_TYPES))}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise AssayError(f"config hidden_act is {cfg['hidden_act']!r}; the native Llama uses silu")
        if int(cfg.get("pretraining_tp") or 1) != 1:
            raise AssayError(f"config has pretraining_tp={cfg['pretraining_tp']}; the native Llama computes the exact projections (1)")
        max_positions = int(cfg.get("max_position_embeddings", 2048))
        window = cfg.get("sliding_window")
        if window is not None and int(window) < max_positions:
            raise AssayError(f"config has sliding_window={window} < max_position_embeddings={max_positions}; "
                             "the native Llama attends causally over all tokens")
        # Transformers 5 nests the rotary settings in rope_parameters; older config.json files keep
        # rope_theta (and rope_scaling) at the top level.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise AssayError(f"config uses rope_type {rope_type!r}; the native Llama implements {', '.join(ROPE_TYPES)}")
        scaling = {}
        if rope_type == "llama3":
            scaling = dict(
                rope_factor=float(rope["factor"]),
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_len=int(rope["original_max_position_embeddings"]),
            )
        n_heads = int(cfg["num_attention_heads"]) if "num_attention_heads" in cfg else 0
        try:
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                dim=int(cfg["hidden_size"]),
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=int(cfg["num_attention_heads"]),
                n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
                head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
                hidden_dim=int(cfg["intermediate_size"]),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                max_seq_len=max_positions,
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                rope_type=rope_type,
                hf_model_type=model_type,
                **scaling,
            )
        except KeyError as missing:
            raise AssayError(f"config has no {missing.args[0]!r}; it is not a complete Llama config") from None

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that Transformers loads as LlamaConfig (or MistralConfig)."""
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "llama3":
            rope.update(factor=self.rope_factor, low_freq_factor=self.rope_low_freq_factor,
                        high_freq_factor=self.rope_high_freq_factor, original_max_position_embeddings=self.rope_original_max_len)
        config: dict[str, Any] = {
            "model_type": self.hf_model_type,
            "architectures": [_ARCHITECTURES[self.hf_model_type]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_dropout": 0.0,
            "use_cache": True,
        }
        if self.hf_model_type == "llama":
            config.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias, pretraining_tp=1)
        else:
            if self.attention_bias or self.mlp_bias:
                raise AssayError("Transformers' Mistral has no projection biases; export this spec as llama")
            config["sliding_window"] = None
        return config


# ---------------------------------------------------------------- overrides from a command line

OVERRIDE_ALIASES: dict[str, str] = {
    "vocab": "vocab_size",
    "layers": "n_layers",
    "heads": "n_heads",
    "kv_heads": "n_kv_heads",
    "hidden": "hidden_dim",
    "ffn": "hidden_dim",
    "eps": "norm_eps",
    "theta": "rope_theta",
    "seq_len": "max_seq_len",
    "tie": "tie_embeddings",
}
_FAMILY = "Llama"


def parse_spec_overrides(text: str) -> dict[str, Any]:
    """ "layers=4,heads=2" -> {"n_layers": 4, "n_heads": 2}; AssayError on a bad item."""
    return spec.parse_spec_overrides(text, LlamaArgs, OVERRIDE_ALIASES, _FAMILY)


def apply_spec_overrides(args: LlamaArgs, overrides: str | Mapping[str, Any] | None) -> LlamaArgs:
    """`dataclasses.replace` with overrides given as a CLI string or a mapping (aliases allowed)."""
    if not overrides:
        return args
    return replace(args, **spec.resolve_spec_overrides(overrides, LlamaArgs, OVERRIDE_ALIASES, _FAMILY))
