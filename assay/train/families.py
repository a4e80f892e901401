"""The architectures the trainer knows: a view of the architecture registry (assay.models.registry).

The trainer never names an architecture: it asks the registry for the entry of a checkpoint's
model_type and calls the entry's functions (load, build from a flavour, count FLOPs, parallelize,
export). A new architecture is a folder under assay/models with its register(...) call, nothing here.
The `hf` path needs an entry only for FLOP counting, and falls back to counting the Transformers
model's linear layers when the model_type is not registered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch import nn

from assay.core.errors import AssayError
from assay.models import registry
from assay.models.registry import ArchSpec, FlopShape

# The trainer's name for an entry; the same object.
ModelFamily = ArchSpec


class _Families(Mapping):
    """model_type -> ArchSpec, read from the registry at each lookup (it loads its entries on first use)."""

    def __getitem__(self, model_type: str) -> ArchSpec:
        return registry.model_types()[model_type]

    def __iter__(self) -> Iterator[str]:
        return iter(registry.model_types())

    def __len__(self) -> int:
        return len(registry.model_types())


FAMILIES: Mapping[str, ArchSpec] = _Families()


def register_family(family: ArchSpec) -> None:
    registry.register(family)


def family_for(model_type: str | None) -> ArchSpec:
    spec = registry.find(model_type)
    if spec is None:
        raise AssayError(
            f"no native model for model_type {model_type!r} (native families: {', '.join(sorted(FAMILIES))}); use --path hf"
        )
    return spec


# ---------------------------------------------------------------- any Transformers causal LM (the hf path)


def hf_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Transformers causal LM: the ModuleList with num_hidden_layers entries."""
    n_layers = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return list(module)
    raise AssayError(f"cannot find the {n_layers} decoder layers of {type(model).__name__}")


def hf_flop_shape(model: nn.Module, config: dict) -> FlopShape:
    """FLOP shape of a Transformers model: from its registry entry when there is one (same count as
    native), else every nn.Linear weight (dense models only: a fused MoE expert tensor is not an nn.Linear)."""
    spec = registry.find(config.get("model_type"))
    if spec is not None:
        return spec.flop_shape(spec.args_from_hf(config))
    active = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    n_heads = int(config.get("num_attention_heads", 0))
    head_dim = int(config.get("head_dim") or (int(config.get("hidden_size", 0)) // max(n_heads, 1)))
    return FlopShape(active, int(config.get("num_hidden_layers", 0)), n_heads * head_dim)


__all__ = ["FAMILIES", "FlopShape", "ModelFamily", "family_for", "hf_blocks", "hf_flop_shape", "register_family"]
