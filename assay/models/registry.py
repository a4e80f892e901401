"""The architecture registry: one entry per native architecture, found by a checkpoint's model_type.

torchtitan's model specs and vLLM's model registry in one: everything that differs by architecture is
answered by its ArchSpec, so train, serve, recall and the zoo never ask "which architecture is this?".

    spec = for_config(read_hf_config("zoo/llama"))           # or get("llama"), or for_model_type("qwen3_moe")
    model, args = spec.load("zoo/llama", None, False, "cpu", torch.float32)
    spec.export_hf(model.state_dict(), args, "out/", "zoo/llama")

Each models/<arch>/__init__.py ends with one `register(ArchSpec(...))`. The packages below are imported
on the first lookup (vLLM's lazy registry: a name and where it lives), so importing this module stays
cheap and a model never imports another.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.serving import CacheSpec, ModelAdapter

# Where the built-in entries live. Adding an architecture: a folder, its register(...) call, one line here.
ARCH_PACKAGES: tuple[str, ...] = ("assay.models.qwen3", "assay.models.gla", "assay.models.llama")


@dataclass(frozen=True)
class FlopShape:
    """What core.metrics.train_flops_per_token needs: active matmul weights per token, layers, attention width."""

    active_matmul_params: int
    n_layers: int
    attention_width: int  # 0 for a recurrence (its cost does not grow with the context)

    def train_flops_per_token(self, seq_len: int) -> float:
        from assay.core.metrics import train_flops_per_token

        return train_flops_per_token(self.active_matmul_params, self.n_layers, self.attention_width, seq_len)


@dataclass(frozen=True)
class ArchSpec:
    """One native architecture: everything a system needs to load, build, train, export and serve it."""

    name: str  # "qwen3", "gla", "llama": the folder under assay/models and what results call it
    label: str  # for people: "attention (Qwen3)", "GLA"
    model_types: tuple[str, ...]  # the HF config model_types this entry owns
    # config.json dict -> args (the architecture's frozen dataclass)
    args_from_hf: Callable[[Mapping[str, Any]], Any]
    # (args, overrides "layers=4,..." or a mapping, or None) -> args
    apply_spec: Callable[[Any, Any], Any]
    # the nn.Module class: model_cls(args) builds it (under torch.device("meta"): shapes only)
    model_cls: type[nn.Module]
    # (args, device, dtype, seed) -> randomly initialised model (on "meta": no init)
    init: Callable[..., nn.Module]
    # (folder, spec overrides, slice_experts, device, dtype) -> (model, args): HF safetensors, single or sharded
    load: Callable[..., tuple[nn.Module, Any]]
    # (model or full plain state dict, args, out_dir, tokenizer_source_dir) -> files written
    export_hf: Callable[..., list]
    # "module:function" of parallelize(model, mesh, tp=, dp_shard=) (TP plan, then FSDP2) and of
    # check_tp_divisible(args, tp); imported on use: torch.distributed only for a run that shards
    parallelize_fn: str
    check_tp_fn: str
    # serving: the cache kind, its slot adapter and its bytes per sequence
    cache: CacheSpec
    # kernel name -> module-name pattern of the modules it replaces in this architecture
    kernel_targets: Mapping[str, str]
    # named sizes, {"tiny": args, ...}
    flavours: Mapping[str, Any] = field(default_factory=dict)
    # (vocab_size, dim, n_layers, n_heads, hidden_dim, max_seq_len) -> args at that size (recall's matched models)
    args_for_size: Callable[..., Any] | None = None

    # ---------------------------------------------------------------- derived, the same for every entry

    def build(self, args: Any, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> nn.Module:
        """The model for args: shapes only on "meta", randomly initialised elsewhere."""
        return self.init(args, device, dtype, seed)

    def parallelize(self, model: nn.Module, mesh, tp: bool, dp_shard: bool) -> nn.Module:
        """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard); in place."""
        return _resolve(self.parallelize_fn)(model, mesh, tp=tp, dp_shard=dp_shard)

    def check_tp(self, args: Any, tp: int) -> None:
        """AssayError when the sizes do not split tp ways (before any process group exists)."""
        if tp > 1:
            _resolve(self.check_tp_fn)(args, tp)

    def flop_shape(self, args: Any) -> FlopShape:
        """Counted on the meta device, so a sharded (or huge) model is counted whole. The attention term
        (PaLM's) counts for a model that attends over a KV cache; a fixed-state recurrence costs O(T) and
        counts its matmul weights only (6N per token, the usual convention for linear attention)."""
        from assay.models.layers import count_parameters

        counts = count_parameters(self.build(args, "meta"), top_k=getattr(args, "top_k", 0))
        attention_width = args.n_heads * args.head_dim if self.cache.grows else 0
        return FlopShape(counts.active_matmul, args.n_layers, attention_width)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks (compiled one by one, FSDP units)."""
        return list(model.layers)

    def flops_per_token(self, args: Any, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) at seq_len: the one formula, core.metrics."""
        return self.flop_shape(args).train_flops_per_token(seq_len)

    def state_bytes_per_sequence(self, args: Any, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
        """Decoding memory of one sequence of seq_len tokens: a KV cache grows with it, a fixed state does not."""
        return self.cache.bytes_per_sequence(args, seq_len, dtype)

    def serving_adapter(self, folder: str | os.PathLike, device: torch.device, max_len: int) -> ModelAdapter:
        """The slot adapter (prefill into a slot, decode a batch of slots) over the checkpoint's model."""
        from pathlib import Path

        return self.cache.adapter.load(self, Path(folder), device, max_len)

    def adapter_for(self, model: nn.Module, args: Any) -> ModelAdapter:
        """The slot adapter over an already loaded model."""
        return self.cache.adapter(model, args, self.name)


def _resolve(path: str) -> Callable:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_BY_NAME: dict[str, ArchSpec] = {}
_BY_MODEL_TYPE: dict[str, ArchSpec] = {}
_loaded = False


def register(spec: ArchSpec) -> ArchSpec:
    """Add an entry; refused when its name or one of its model_types is taken by another entry."""
    existing = _BY_NAME.get(spec.name)
    if existing is not None and existing is not spec:
        raise AssayError(f"an architecture named {spec.name!r} is already registered")
    for model_type in spec.model_types:
        owner = _BY_MODEL_TYPE.get(model_type)
        if owner is not None and owner.name != spec.name:
            raise AssayError(f"model_type {model_type!r} is already owned by the {owner.name} entry")
    _BY_NAME[spec.name] = spec
    _BY_MODEL_TYPE.update(dict.fromkeys(spec.model_types, spec))
    return spec


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        for package in ARCH_PACKAGES:
            importlib.import_module(package)  # each package's __init__ registers its entry
        _loaded = True


def names() -> list[str]:
    _ensure_loaded()
    return sorted(_BY_NAME)


def all_specs() -> list[ArchSpec]:
    _ensure_loaded()
    return [_BY_NAME[name] for name in sorted(_BY_NAME)]


def model_types() -> dict[str, ArchSpec]:
    _ensure_loaded()
    return dict(_BY_MODEL_TYPE)


def get(name: str) -> ArchSpec:
    _ensure_loaded()
    try:
        return _BY_NAME[name]
    except KeyError:
        raise AssayError(f"unknown architecture {name!r} (registered: {', '.join(sorted(_BY_NAME))})") from None


def find(model_type: str | None) -> ArchSpec | None:
    """The entry owning model_type, or None (the caller then takes Transformers' path)."""
    _ensure_loaded()
    return _BY_MODEL_TYPE.get(model_type or "")


def for_model_type(model_type: str | None) -> ArchSpec:
    spec = find(model_type)
    if spec is None:
        raise AssayError(f"no native model for model_type {model_type!r} (native: {', '.join(sorted(_BY_MODEL_TYPE))})")
    return spec


def for_config(config: Mapping[str, Any]) -> ArchSpec:
    """The entry for a config.json dict (AssayError when no entry owns its model_type)."""
    return for_model_type(config.get("model_type"))


def for_checkpoint(folder: str | os.PathLike) -> ArchSpec:
    from assay.models.hf_checkpoint import read_hf_config

    return for_config(read_hf_config(folder))
