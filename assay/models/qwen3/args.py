"""Qwen3Args: every size and switch of the native Qwen3 (dense and mixture-of-experts), with defaults.

Sizes are data: a flavour is one Qwen3Args, an override is `dataclasses.replace`. The same args
convert to and from a Transformers config (Qwen3Config / Qwen3MoeConfig) so a checkpoint's
config.json decides the architecture and an export reloads with AutoModelForCausalLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from assay.core.errors import AssayError
from assay.models.common.args import TransformerArgs, rope_parameters

HF_DENSE_MODEL_TYPE = "qwen3"
HF_MOE_MODEL_TYPE = "qwen3_moe"


@dataclass(frozen=True, kw_only=True)
class Qwen3Args(TransformerArgs):
    # hidden_dim: SwiGLU width of the dense feed-forward (and of the dense layers of an MoE model)
    rope_theta: float = 1_000_000.0
    max_seq_len: int = 40960
    qk_norm: bool = True
    # Mixture of experts: n_experts = 0 is a dense model and the fields below are unused.
    n_experts: int = 0
    top_k: int = 0
    moe_hidden_dim: int = 0
    norm_topk_prob: bool = True
    # Which layers are MoE, Transformers' rule: (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers.
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    FAMILY: ClassVar[str] = "Qwen3"
    HF_MODEL_TYPES: ClassVar[tuple[str, ...]] = (HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE)
    ALIASES: ClassVar[dict[str, str]] = {
        **TransformerArgs.ALIASES, "experts": "n_experts", "moe_hidden": "moe_hidden_dim", "norm_topk": "norm_topk_prob",
        "sparse_step": "decoder_sparse_step",
    }

    def __post_init__(self) -> None:
        # Frozen: normalise a list given by a caller or a JSON config into the hashable tuple.
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.n_experts < 0:
            problems.append(f"n_experts={self.n_experts} must be >= 0")
        if self.n_experts > 0:
            if not 1 <= self.top_k <= self.n_experts:
                problems.append(f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
            if self.moe_hidden_dim < 1:
                problems.append(f"moe_hidden_dim={self.moe_hidden_dim} must be >= 1 for an MoE model")
            if self.decoder_sparse_step < 1:
                problems.append(f"decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
        return problems

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
    def fields_from_hf(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        if cfg.get("attention_bias"):
            raise AssayError("config has attention_bias=true; the native Qwen3 has no attention biases")
        if cfg.get("hidden_act", "silu") != "silu":
            raise AssayError(f"config hidden_act is {cfg['hidden_act']!r}; the native Qwen3 uses silu")
        if cfg.get("use_sliding_window"):
            raise AssayError("config enables sliding-window attention; the native Qwen3 attends causally over all tokens")
        rope_type = rope_parameters(cfg)["rope_type"]
        if rope_type != "default":
            raise AssayError(f"config uses rope_type {rope_type!r}; the native Qwen3 implements only the default rotary")
        moe: dict[str, Any] = {}
        if cfg["model_type"] == HF_MOE_MODEL_TYPE:
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
        return cls._transformer_fields_from_hf(cfg) | moe

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that Transformers loads as Qwen3Config (dense) or Qwen3MoeConfig (MoE)."""
        if not self.qk_norm:
            raise AssayError("Transformers' Qwen3 always normalises q and k per head; a spec with qk_norm=False has no HF form")
        config = self._transformer_hf_config(*((HF_MOE_MODEL_TYPE, "Qwen3MoeForCausalLM") if self.is_moe else (HF_DENSE_MODEL_TYPE, "Qwen3ForCausalLM")))
        config.update(
            hidden_act="silu",
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
        )
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
