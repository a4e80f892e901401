"""The args bases every native model's frozen args dataclass builds on: the shared fields and their
checks, the Transformers config.json reader's skeleton, and overrides from a command line.

    ModelArgs         every causal LM: vocabulary, width, depth, heads, feed-forward width, norm eps, tie,
                      longest sequence; `from_hf_config` (model_type check, one error for a missing key),
                      `with_overrides("layers=4,heads=2")`
    TransformerArgs   + key/value heads, head_dim and the rotary base: the attention models' common
                      config.json fields both ways (`_transformer_fields_from_hf`, `_transformer_hf_config`)

An architecture's args subclass adds its own fields, FAMILY / HF_MODEL_TYPES / ALIASES, `fields_from_hf`
(what its config.json says, refusing what the model does not implement) and `to_hf_config`. The dataclasses
are keyword-only, so a subclass may add fields without defaults after the base's defaulted ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from assay.core.errors import AssayError
from assay.models.common import overrides


@dataclass(frozen=True, kw_only=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    hidden_dim: int  # the feed-forward (SwiGLU / GeGLU) width
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    max_seq_len: int = 2048

    FAMILY: ClassVar[str] = "model"  # how messages name the architecture: "Llama", "Qwen3", "GLA"
    HF_MODEL_TYPES: ClassVar[tuple[str, ...]] = ()  # the config.json model_types its reader accepts
    # Short names a user types after --spec ("layers=4"); every field name is accepted as well.
    ALIASES: ClassVar[Mapping[str, str]] = {
        "vocab": "vocab_size", "layers": "n_layers", "heads": "n_heads", "hidden": "hidden_dim", "ffn": "hidden_dim",
        "eps": "norm_eps", "seq_len": "max_seq_len", "tie": "tie_embeddings",
    }
    POSITIVE: ClassVar[tuple[str, ...]] = ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_seq_len")

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise AssayError(f"invalid {self.FAMILY} spec: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this spec cannot be built (a subclass extends the list): reported together."""
        problems = [f"{name}={getattr(self, name)} must be >= 1" for name in self.POSITIVE if int(getattr(self, name)) < 1]
        if self.norm_eps <= 0:
            problems.append("norm_eps must be > 0")
        return problems

    # ---------------------------------------------------------------- Transformers config

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any):
        """From a config.json dict or a Transformers config object (no `architectures` needed)."""
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        model_type = cfg.get("model_type")
        if model_type not in cls.HF_MODEL_TYPES:
            raise AssayError(f"config model_type is {model_type!r}; the native {cls.FAMILY} reads {' or '.join(map(repr, cls.HF_MODEL_TYPES))}")
        try:
            return cls(**cls.fields_from_hf(cfg))
        except KeyError as missing:
            raise AssayError(f"config has no {missing.args[0]!r}; it is not a complete {cls.FAMILY} config") from None

    @classmethod
    def fields_from_hf(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """The dataclass fields a config.json dict gives (KeyError for a missing required key); AssayError
        for what the native model does not implement, with the reason."""
        raise NotImplementedError

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json dict Transformers (or the architecture's own Auto registration) loads."""
        raise NotImplementedError

    # ---------------------------------------------------------------- overrides from a command line

    @classmethod
    def parse_overrides(cls, text: str) -> dict[str, Any]:
        """ "layers=4,heads=2" -> {"n_layers": 4, "n_heads": 2}; AssayError on a bad item."""
        return overrides.parse_overrides(text, cls, cls.ALIASES, cls.FAMILY)

    @classmethod
    def resolve_overrides(cls, given: str | Mapping[str, Any]) -> dict[str, Any]:
        """Overrides as a CLI string or a mapping (aliases allowed) -> {field name: value}."""
        return overrides.resolve_overrides(given, cls, cls.ALIASES, cls.FAMILY)

    def with_overrides(self, given: str | Mapping[str, Any] | None):
        """`dataclasses.replace` with overrides given as a CLI string or a mapping; None: self."""
        if not given:
            return self
        return replace(self, **self.resolve_overrides(given))


def rope_parameters(cfg: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """The rotary settings of a config.json: Transformers 5 nests them in rope_parameters (per layer type
    for models with several); older files keep rope_theta (and rope_scaling) at the top level."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if layer_type is not None and isinstance(rope.get(layer_type), Mapping):
        rope = dict(rope[layer_type])
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


@dataclass(frozen=True, kw_only=True)
class TransformerArgs(ModelArgs):
    """The fields every softmax-attention model here shares (Llama, Qwen3, Gemma 3)."""

    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0

    ALIASES: ClassVar[Mapping[str, str]] = {**ModelArgs.ALIASES, "kv_heads": "n_kv_heads", "theta": "rope_theta"}
    POSITIVE: ClassVar[tuple[str, ...]] = (*ModelArgs.POSITIVE, "n_kv_heads", "head_dim")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.n_kv_heads >= 1 and self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.rope_theta <= 0:
            problems.append("rope_theta must be > 0")
        return problems

    @classmethod
    def for_size(cls, vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int, max_seq_len: int):
        """Multi-head (as many key/value heads as query heads) at dim / n_heads per head, the class's other
        defaults (recall's models matched in size)."""
        if dim % n_heads:
            raise AssayError(f"dim {dim} is not a multiple of {n_heads} heads")
        return cls(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                   head_dim=dim // n_heads, hidden_dim=hidden_dim, max_seq_len=max_seq_len)

    # ---------------------------------------------------------------- per-layer geometry (the root and the KV cache ask)

    @property
    def rope_scaling(self) -> Any:
        """The rotary scaling of the (single) table, or None."""
        return None

    def rope_tables(self) -> list[tuple[float, Any]]:
        """(theta, scaling or None) of each rotary table the model keeps; layer i reads table rope_kind(i)."""
        return [(self.rope_theta, self.rope_scaling)]

    def rope_kind(self, layer_id: int) -> int:
        return 0

    def layer_window(self, layer_id: int) -> int | None:
        """The sliding window of layer layer_id (it attends to itself and window - 1 predecessors); None: all."""
        return None

    @classmethod
    def _transformer_fields_from_hf(cls, cfg: dict[str, Any], rope_theta: float | None = None) -> dict[str, Any]:
        """The shared fields of a Transformers decoder config (KeyError when a required one is missing)."""
        n_heads = int(cfg["num_attention_heads"])
        if rope_theta is None:
            rope_theta = rope_parameters(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0))
        return dict(
            vocab_size=int(cfg["vocab_size"]),
            dim=int(cfg["hidden_size"]),
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
            hidden_dim=int(cfg["intermediate_size"]),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_seq_len=int(cfg.get("max_position_embeddings", cls.max_seq_len)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", cls.tie_embeddings)),
        )

    def _transformer_hf_config(self, model_type: str, architecture: str) -> dict[str, Any]:
        """The shared keys of the config.json an export writes (the caller adds its own)."""
        return {
            "model_type": model_type,
            "architectures": [architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim,
            "rms_norm_eps": self.norm_eps,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_dropout": 0.0,
            "use_cache": True,
        }
