"""LlamaArgs: every size and switch of the native Llama (Llama 2/3, SmolLM2, Mistral-dense), with defaults.

Sizes are data: a flavour is one LlamaArgs, an override is `dataclasses.replace`. The same args convert
to and from a Transformers LlamaConfig, so a checkpoint's config.json decides the architecture and an
export reloads with AutoModelForCausalLM. Mistral's config (model_type "mistral") is the same layout
when its sliding window does not bind; the export writes the model_type it was read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from assay.core.errors import AssayError
from assay.models.common.args import TransformerArgs, rope_parameters
from assay.models.common.rope import RopeScaling

HF_MODEL_TYPES = ("llama", "mistral")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True, kw_only=True)
class LlamaArgs(TransformerArgs):
    norm_eps: float = 1e-5
    attention_bias: bool = False  # q, k, v and o projections (Transformers' attention_bias)
    mlp_bias: bool = False  # gate, up and down projections
    # Rotary scaling: "default" (none) or "llama3" (Llama 3.1+: long wavelengths stretched by rope_factor).
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    hf_model_type: str = "llama"  # what the export writes back: "llama" or "mistral"

    FAMILY: ClassVar[str] = "Llama"
    HF_MODEL_TYPES: ClassVar[tuple[str, ...]] = HF_MODEL_TYPES

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.rope_type not in ROPE_TYPES:
            problems.append(f"rope_type={self.rope_type!r} must be one of {', '.join(ROPE_TYPES)}")
        if self.rope_type == "llama3" and (self.rope_factor <= 0 or self.rope_high_freq_factor <= self.rope_low_freq_factor):
            problems.append("llama3 rope scaling needs rope_factor > 0 and rope_high_freq_factor > rope_low_freq_factor")
        if self.hf_model_type not in HF_MODEL_TYPES:
            problems.append(f"hf_model_type={self.hf_model_type!r} must be one of {', '.join(HF_MODEL_TYPES)}")
        return problems

    @property
    def rope_scaling(self) -> RopeScaling | None:
        if self.rope_type != "llama3":
            return None
        return RopeScaling(self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_max_len)

    # ---------------------------------------------------------------- Transformers config

    @classmethod
    def fields_from_hf(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        if cfg.get("hidden_act", "silu") != "silu":
            raise AssayError(f"config hidden_act is {cfg['hidden_act']!r}; the native Llama uses silu")
        if int(cfg.get("pretraining_tp") or 1) != 1:
            raise AssayError(f"config has pretraining_tp={cfg['pretraining_tp']}; the native Llama computes the exact projections (1)")
        max_positions = int(cfg.get("max_position_embeddings", cls.max_seq_len))
        window = cfg.get("sliding_window")
        if window is not None and int(window) < max_positions:
            raise AssayError(f"config has sliding_window={window} < max_position_embeddings={max_positions}; "
                             "the native Llama attends causally over all tokens")
        rope = rope_parameters(cfg)
        if rope["rope_type"] not in ROPE_TYPES:
            raise AssayError(f"config uses rope_type {rope['rope_type']!r}; the native Llama implements {', '.join(ROPE_TYPES)}")
        scaling = {}
        if rope["rope_type"] == "llama3":
            scaling = dict(
                rope_factor=float(rope["factor"]),
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_len=int(rope["original_max_position_embeddings"]),
            )
        return cls._transformer_fields_from_hf(cfg) | scaling | dict(
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope_type=rope["rope_type"],
            hf_model_type=cfg["model_type"],
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that Transformers loads as LlamaConfig (or MistralConfig)."""
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "llama3":
            rope.update(factor=self.rope_factor, low_freq_factor=self.rope_low_freq_factor,
                        high_freq_factor=self.rope_high_freq_factor, original_max_position_embeddings=self.rope_original_max_len)
        config = self._transformer_hf_config(self.hf_model_type, _ARCHITECTURES[self.hf_model_type])
        config.update(hidden_act="silu", rope_parameters=rope)
        if self.hf_model_type == "llama":
            config.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias, pretraining_tp=1)
        else:
            if self.attention_bias or self.mlp_bias:
                raise AssayError("Transformers' Mistral has no projection biases; export this spec as llama")
            config["sliding_window"] = None
        return config

