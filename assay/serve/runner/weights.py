"""How the engine finds the adapter of a checkpoint: the architecture registry's entry for its
config.json model_type gives it (assay.models.registry, ArchSpec.cache.adapter). The adapters
themselves live with the models (assay.models.slots):
  StateAdapter    the fixed-state model (GLA): one float32 (or bfloat16) [H, K, V] matrix per layer and
                  slot, whatever the length; prefill through the chunked form, decode through the step.
  KVCacheAdapter  a transformer with a key/value cache per slot (Qwen3, Llama): [max_len, Hkv, D] per
                  layer for k and for v, sized for the longest sequence the engine accepts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Callable

import torch

from assay.core.dtypes import dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.models import registry
from assay.models.slots import KV_REFERENCE_DTYPE, KVCacheAdapter, KVLayout, ModelAdapter, StateAdapter
from assay.serve.runner.dtypes import check_state_dtype, check_weight_dtype

KV_REFERENCE_LENGTHS = (2048, 8192)


def state_dtype(name: str) -> torch.dtype:
    return torch_dtype(check_state_dtype(name))


def weight_dtype(name: str) -> torch.dtype:
    return torch_dtype(check_weight_dtype(name))


def cast_weights(adapter: ModelAdapter, dtype: torch.dtype | str) -> ModelAdapter:
    """The adapter's model with its parameters (and persistent buffers) in `dtype`, in place, as a load in
    that dtype leaves them: derived buffers such as a rotary table stay float32. Before the first decode
    (a compiled graph is traced with the dtypes it first sees). The adapters return float32 logits."""
    dtype = weight_dtype(dtype) if isinstance(dtype, str) else dtype
    for module in adapter.model.modules():
        for param in module.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)  # a tied embedding/output is one Parameter: cast once
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point() and name not in module._non_persistent_buffers_set:
                module._buffers[name] = buffer.to(dtype)
    return adapter


def adapter_dtype(adapter: ModelAdapter) -> str:
    """The dtype of the served model's weights, by name ("float32", "bfloat16")."""
    return dtype_name(str(next(adapter.model.parameters()).dtype).removeprefix("torch."), aliases=False) or "float32"


class _Adapters(Mapping):
    """model_type -> loader (folder, device, max_len) -> adapter, for every registered architecture."""

    def __getitem__(self, model_type: str) -> Callable[[Path, torch.device, int], ModelAdapter]:
        return registry.model_types()[model_type].serving_adapter

    def __iter__(self) -> Iterator[str]:
        return iter(registry.model_types())

    def __len__(self) -> int:
        return len(registry.model_types())


ADAPTERS: Mapping[str, Callable[[Path, torch.device, int], ModelAdapter]] = _Adapters()


def model_type_of(folder: str | os.PathLike) -> str:
    from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

    config = read_hf_config(checkpoint_dir(folder))
    return str(config.get("model_type", ""))


def load_adapter(folder: str | os.PathLike, device: torch.device, max_len: int, dtype: str = "float32") -> ModelAdapter:
    """The adapter for the checkpoint's config.json model_type, its weights in `dtype` (float32 or
    bfloat16); AssayError for an architecture not served."""
    from assay.models.hf_checkpoint import checkpoint_dir

    path = checkpoint_dir(folder)
    model_type = model_type_of(path)
    spec = registry.find(model_type)
    if spec is None:
        raise AssayError(f"{folder}: model_type {model_type!r} is not served (served: {', '.join(sorted(ADAPTERS))})")
    wanted = weight_dtype(dtype)
    adapter = spec.serving_adapter(path, device, max_len)
    return adapter if wanted == torch.float32 else cast_weights(adapter, wanted)


