"""Qwen3Args: every size and switch of the native Qwen3 (dense and mixture-of-experts), with defaults.

Sizes are data: a flavour is one Qwen3Args, an override is `dataclasses.replace`. The same spec
converts to and from a Transformers config (Qwen3Config / Qwen3MoeConfig) so a checkpoint's
config.json decides the architecture and an export reloads with AutoModelForCausalLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from assay.core.errors import AssayError
from assay.models import spec

HF_DENSE_MODEL_TYPE = "qwen3"
HF_MOE_MODEL_TYPE = "qwen3_moe"


@dataclass(frozen=True)
class Qwen3Args:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # SwiGLU width of the dense feed-forward (and of the dense layers of an MoE model)
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_seq_len: int = 40960
    tie_embeddings: bool = False
    qk_norm: bool = True
    # Mixture of experts: n_experts = 0 is a dense model and the fields below are unused.
    n_experts: int = 0
    top_k: int = 0
    moe_hidden_dim: int = 0
    norm_topk_prob: bool = True
    # Which layers are MoE, Transformers' rule: (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers.
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Frozen: normalise a list given by a caller or a JSON config into the hashable tuple.
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
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
        if self.n_experts < 0:
            problems.append(f"n_experts={self.n_experts} must be >= 0")
        if self.n_experts > 0:
            if not 1 <= self.top_k <= self.n_experts:
                problems.append(f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
            if self.moe_hidden_dim < 1:
                problems.append(f"moe_hidden_dim={self.moe_hidden_dim} must be >= 1 for an MoE model")
            if self.decoder_sparse_step < 1:
                problems.append(f"decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
        if problems:
            raise AssayError("invalid Qwen3 spec: " + "; ".join(problems))

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, layer_id: int) -> bool:
        return (
            self.n_experts > 0
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    # ---------------------------------------------------------------- Transformers config

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> "Qwen3Args":
        """From a config.json dict or a Transformers PreTrainedConfig (Qwen3Config / Qwen3MoeConfig)."""
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        model_type = cfg.get("model_type")
        if model_type not in (HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE):
            raise AssayError(f"config model_type is {model_type!r}; the native Qwen3 reads 'qwen3' or 'qwen3_moe'")
        if cfg.get("attention_bias"):
            raise AssayError("config has attention_bias=true; the native Qwen3 has no attention biases")
        if cfg.get("hidden_act", "silu") != "silu":
            raise AssayError(f"config hidden_act is {cfg['hidden_act']!r}; the native Qwen3 uses silu")
        if cfg.get("use_sliding_window"):
            raise AssayError("config enables sliding-window attention; the native Qwen3 attends causally over all tokens")
        # Transformers 5 nests the rotary settings in rope_parameters; older config.json files keep
        # rope_theta (and rope_scaling) at the top level.
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise AssayError(f"config uses rope_type {rope_type!r}; the native Qwen3 implements only the default rotary")
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        n_heads = int(cfg["num_attention_heads"])
        moe: dict[str, Any] = {}
        if model_type == HF_MOE_MODEL_TYPE:
            # Transformers 5 writes num_local_experts (attribute_map); the published checkpoints say num_experts.
            n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
            moe = dict(
                n_experts=int(n_experts),
                top_k=int(cfg["num_experts_per_tok"]),
                moe_hidden_dim=int(cfg["moe_intermediate_size"]),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            )
        try:
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                dim=int(cfg["hidden_size"]),
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
                head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
                hidden_dim=int(cfg["intermediate_size"]),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                max_seq_len=int(cfg.get("max_position_embeddings", 40960)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                **moe,
            )
        except KeyError as missing:
            raise AssayError(f"config has no {missing.args[0]!r}; it is not a complete Qwen3 config") from None

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that Transformers loads as Qwen3Config (dense) or Qwen3MoeConfig (MoE)."""
        if not self.qk_norm:
            raise AssayError("Transformers' Qwen3 always normalises q and k per head; a spec with qk_norm=False has no HF form")
        config: dict[str, Any] = {
            "model_type": HF_MOE_MODEL_TYPE if self.is_moe else HF_DENSE_MODEL_TYPE,
            "architectures": ["Qwen3MoeForCausalLM" if self.is_moe else "Qwen3ForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "use_cache": True,
        }
        if self.is_moe:
            config.update(
                num_experts=self.n_experts,
                num_experts_per_tok=self.top_k,
                moe_intermediate_size=self.moe_hidden_dim,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        else:
            config.update(max_window_layers=self.n_layers, layer_types=["full_attention"] * self.n_layers)
        return config


# ---------------------------------------------------------------- overrides from a command line

# Short names a user types after --spec; every field name is accepted as well.
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
    "experts": "n_experts",
    "moe_hidden": "moe_hidden_dim",
    "norm_topk": "norm_topk_prob",
    "sparse_step": "decoder_sparse_step",
}

_FAMILY = "Qwen3"


def parse_spec_overrides(text: str) -> dict[str, Any]:
    """ "layers=4,experts=8,top_k=2" -> {"n_layers": 4, "n_experts": 8, "top_k": 2}; AssayError on a bad item."""
    return spec.parse_spec_overrides(text, Qwen3Args, OVERRIDE_ALIASES, _FAMILY)


def apply_spec_overrides(args: Qwen3Args, overrides: str | Mapping[str, Any] | None) -> Qwen3Args:
    """`dataclasses.replace` with overrides given as a CLI string or a mapping (aliases allowed)."""
    if not overrides:
        return args
    return replace(args, **spec.resolve_spec_overrides(overrides, Qwen3Args, OVERRIDE_ALIASES, _FAMILY))
