"""What the trainer needs of any Transformers causal LM (the `hf` path): its repeated blocks and its FLOP shape.

The native path asks the architecture registry (assay.models.registry) instead. The `hf` path needs an
entry only for FLOP counting, and falls back to counting the Transformers model's linear layers when
the model_type is not registered.
"""

from __future__ import annotations

from torch import nn

from assay.core.errors import AssayError
from assay.models import registry
from assay.models.registry import FlopShape


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


__all__ = ["hf_blocks", "hf_flop_shape"]
