"""Gemma3Args: every size and switch of the native Gemma 3 (text), with defaults, to and from Transformers'
Gemma3TextConfig (model_type "gemma3_text").

What Gemma 3 adds to the shared TransformerArgs: sliding-window and global layers (layer_types, or the
older sliding_window_pattern: every sixth layer global), a rotary base per kind (rope_local_theta for the
sliding layers; the global one may be linearly scaled: rope_factor, Gemma 3 4B and up), the attention
scale query_pre_attn_scalar ** -0.5, the GeGLU activation, an optional final logit soft-cap, tied embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from assay.core.errors import AssayError
from assay.models.common.args import TransformerArgs, rope_parameters
from assay.models.common.feed_forward import ACTIVATIONS
from assay.models.common.rope import LinearRopeScaling

HF_MODEL_TYPE = "gemma3_text"
SLIDING, FULL = "sliding_attention", "full_attention"
GLOBAL_ROPE_TYPES = ("default", "linear")


def pattern_layer_types(n_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Transformers' rule without layer_types: layer i is global when (i + 1) % pattern == 0."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))


@dataclass(frozen=True, kw_only=True)
class Gemma3Args(TransformerArgs):
    rope_theta: float = 1_000_000.0  # the global layers' base
    rope_local_theta: float = 10_000.0  # the sliding layers' base
    rope_factor: float = 1.0  # linear scaling of the global rotary (1: none)
    max_seq_len: int = 131072
    tie_embeddings: bool = True
    sliding_window: int = 4096  # a sliding layer attends to itself and sliding_window - 1 predecessors
    layer_types: tuple[str, ...] = ()  # per layer SLIDING or FULL; () -> every sixth layer FULL
    query_pre_attn_scalar: int = 256  # attention scale = query_pre_attn_scalar ** -0.5
    hidden_act: str = "gelu_pytorch_tanh"
    attention_bias: bool = False
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)

    FAMILY: ClassVar[str] = "Gemma 3"
    HF_MODEL_TYPES: ClassVar[tuple[str, ...]] = (HF_MODEL_TYPE,)
    ALIASES: ClassVar[Mapping[str, str]] = {**TransformerArgs.ALIASES, "window": "sliding_window", "local_theta": "rope_local_theta"}

    def __post_init__(self) -> None:
        # Frozen: a list from a caller or a JSON config becomes the hashable tuple; none given, the default pattern.
        layer_types = tuple(self.layer_types) or pattern_layer_types(self.n_layers)
        object.__setattr__(self, "layer_types", layer_types)
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = super().problems()
        if len(self.layer_types) != self.n_layers or set(self.layer_types) - {SLIDING, FULL}:
            problems.append(f"layer_types must name {SLIDING!r} or {FULL!r} for each of the {self.n_layers} layers")
        if self.sliding_window < 1 or self.query_pre_attn_scalar <= 0 or self.rope_local_theta <= 0 or self.rope_factor <= 0:
            problems.append("sliding_window, query_pre_attn_scalar, rope_local_theta and rope_factor must be > 0")
        if self.hidden_act not in ACTIVATIONS:
            problems.append(f"hidden_act={self.hidden_act!r} must be one of {', '.join(ACTIVATIONS)}")
        return problems

    # ---------------------------------------------------------------- per-layer geometry

    @property
    def attention_scale(self) -> float | None:
        """None where it is SDPA's default (head_dim ** -0.5): those layers keep the plain attention seam."""
        return None if self.query_pre_attn_scalar == self.head_dim else self.query_pre_attn_scalar ** -0.5

    def rope_tables(self) -> list[tuple[float, Any]]:
        scaling = LinearRopeScaling(self.rope_factor) if self.rope_factor != 1.0 else None
        return [(self.rope_theta, scaling), (self.rope_local_theta, None)]  # kind 0: global, kind 1: sliding

    def rope_kind(self, layer_id: int) -> int:
        return int(self.layer_types[layer_id] == SLIDING)

    def layer_window(self, layer_id: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_id] == SLIDING else None

    def with_overrides(self, given):
        """A new depth without new layer_types keeps the first layers' types (and the pattern past them)."""
        if not given:
            return self
        resolved = self.resolve_overrides(given)
        n_layers = resolved.get("n_layers", self.n_layers)
        if "layer_types" not in resolved and n_layers != len(self.layer_types):
            resolved["layer_types"] = (self.layer_types + pattern_layer_types(n_layers)[len(self.layer_types):])[:n_layers]
        return replace(self, **resolved)

    # ---------------------------------------------------------------- Transformers config

    @classmethod
    def fields_from_hf(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        if cfg.get("use_bidirectional_attention"):
            raise AssayError("config sets use_bidirectional_attention; the native Gemma 3 attends causally")
        if cfg.get("attn_logit_softcapping") is not None:
            # Transformers' Gemma3Attention stores it and never applies it (Gemma 2's did): no model to agree with.
            raise AssayError(f"config sets attn_logit_softcapping={cfg['attn_logit_softcapping']}, which Transformers' Gemma 3 "
                             "does not apply; the native Gemma 3 refuses it rather than pick a meaning")
        activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if activation not in ACTIVATIONS:
            raise AssayError(f"config hidden_activation is {activation!r}; the native Gemma 3 implements {', '.join(ACTIVATIONS)}")
        if (cfg.get("rope_parameters") or {}).get(FULL) is not None:  # Transformers 5: one dict per layer type
            global_rope, local_rope = rope_parameters(cfg, FULL), rope_parameters(cfg, SLIDING)
        else:  # older config.json: rope_theta, rope_local_base_freq, rope_scaling for the global layers
            global_rope = rope_parameters(cfg) | {"rope_theta": cfg.get("rope_theta", cls.rope_theta)}
            local_rope = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", cls.rope_local_theta)}
        if global_rope["rope_type"] not in GLOBAL_ROPE_TYPES or local_rope["rope_type"] != "default":
            raise AssayError(f"config uses rope_type {global_rope['rope_type']!r} (global) / {local_rope['rope_type']!r} (sliding); "
                             "the native Gemma 3 implements default or linear (global) and default (sliding)")
        n_layers = int(cfg["num_hidden_layers"])
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        layer_types = tuple(cfg.get("layer_types") or pattern_layer_types(n_layers, pattern))
        if SLIDING in layer_types and not cfg.get("sliding_window"):
            raise AssayError("config has sliding-attention layers but no sliding_window")
        return cls._transformer_fields_from_hf(cfg, rope_theta=global_rope.get("rope_theta", cls.rope_theta)) | dict(
            rope_local_theta=float(local_rope.get("rope_theta", cls.rope_local_theta)),
            rope_factor=float(global_rope.get("factor", 1.0)) if global_rope["rope_type"] == "linear" else 1.0,
            sliding_window=int(cfg.get("sliding_window") or cls.sliding_window),
            layer_types=layer_types,
            query_pre_attn_scalar=int(cfg.get("query_pre_attn_scalar", cls.query_pre_attn_scalar)),
            hidden_act=activation,
            attention_bias=bool(cfg.get("attention_bias", False)),
            final_logit_softcapping=_optional_float(cfg.get("final_logit_softcapping")),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict that Transformers loads as Gemma3TextConfig (Gemma3ForCausalLM)."""
        global_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_factor != 1.0:
            global_rope.update(rope_type="linear", factor=self.rope_factor)
        config = self._transformer_hf_config(HF_MODEL_TYPE, "Gemma3ForCausalLM")
        config.update(
            hidden_activation=self.hidden_act,
            rope_parameters={FULL: global_rope, SLIDING: {"rope_type": "default", "rope_theta": self.rope_local_theta}},
            sliding_window=self.sliding_window,
            layer_types=list(self.layer_types),
            query_pre_attn_scalar=self.query_pre_attn_scalar,
            attention_bias=self.attention_bias,
            final_logit_softcapping=self.final_logit_softcapping,
            attn_logit_softcapping=None,
            use_bidirectional_attention=False,
        )
        return config


def _optional_float(value) -> float | None:
    return None if value is None else float(value)
