"""Loading a checkpoint for serving: its slot model, found through the architecture registry's entry for
config.json's model_type (assay.models.registry, ArchSpec.cache.slot_model), with its weights cast to the
served dtype; and its tokenizer. The slot models themselves live with the models (assay.models.slots):
  StateSlotModel    the fixed-state model (GLA): one float32 (or bfloat16) [H, K, V] matrix per layer and
                    slot, whatever the length; prefill through the chunked form, decode through the step.
  KVCacheSlotModel  a transformer with a key/value cache per slot (Qwen3, Llama, Gemma 3): [max_len, Hkv, D]
                    per layer for k and for v, sized for the longest sequence the engine accepts.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from assay.core.dtypes import dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.models import registry
from assay.models.common.decoder import SoftcappedOutput
from assay.models.slots import SlotModel
from assay.serve.runner.dtypes import check_state_dtype, check_weight_dtype
from assay.serve.runner.quantize import Int8WeightOnlyLinear, is_quantized

KV_REFERENCE_LENGTHS = (2048, 8192)


def state_dtype(name: str) -> torch.dtype:
    return torch_dtype(check_state_dtype(name))


def weight_dtype(name: str) -> torch.dtype:
    return torch_dtype(check_weight_dtype(name))


def cast_weights(slot_model: SlotModel, dtype: torch.dtype | str) -> SlotModel:
    """The slot model's weights with its parameters (and persistent buffers) in `dtype`, in place, as a load in
    that dtype leaves them: derived buffers such as a rotary table stay float32. Before the first decode
    (a compiled graph is traced with the dtypes it first sees). Slot models return float32 logits."""
    dtype = weight_dtype(dtype) if isinstance(dtype, str) else dtype
    for module in slot_model.model.modules():
        for param in module.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)  # a tied embedding/output is one Parameter: cast once
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point() and name not in module._non_persistent_buffers_set:
                module._buffers[name] = buffer.to(dtype)
    return slot_model


def weights_dtype(slot_model: SlotModel) -> str:
    """The dtype of the served model's weights, by name ("float32", "bfloat16"; "int8" when its linears are
    quantized, serve/runner/quantize.py)."""
    if is_quantized(slot_model.model):
        return "int8"
    return dtype_name(str(next(slot_model.model.parameters()).dtype).removeprefix("torch."), aliases=False) or "float32"


def matmul_weight_bytes(model: nn.Module) -> int:
    """The bytes a decode step reads to multiply by every weight once: each linear's weight (int8 and its scales
    when quantized; a head tied to the embedding counted once, as the head). An embedding lookup reads only its
    rows and is left out."""
    seen, total = set(), 0
    for module in model.modules():
        tensors = [module.weight_int8, module.scale] if isinstance(module, Int8WeightOnlyLinear) else \
            [module.weight] if isinstance(module, (nn.Linear, SoftcappedOutput)) else []
        for tensor in tensors:
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.numel() * tensor.element_size()
    return total


def model_type_of(folder: str | os.PathLike) -> str:
    from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

    config = read_hf_config(checkpoint_dir(folder))
    return str(config.get("model_type", ""))


def load_slot_model(folder: str | os.PathLike, device: torch.device, max_len: int, dtype: str = "float32") -> SlotModel:
    """The slot_model for the checkpoint's config.json model_type, its weights in `dtype` (float32 or
    bfloat16); AssayError for an architecture not served."""
    from assay.models.hf_checkpoint import checkpoint_dir

    path = checkpoint_dir(folder)
    model_type = model_type_of(path)
    spec = registry.find(model_type)
    if spec is None:
        raise AssayError(f"{folder}: model_type {model_type!r} is not served (served: {', '.join(sorted(registry.model_types()))})")
    wanted = weight_dtype(dtype)
    slot_model = spec.load_slot_model(path, device, max_len)
    return slot_model if wanted == torch.float32 else cast_weights(slot_model, wanted)


def load_tokenizer(folder: str | os.PathLike):
    """The checkpoint's own Hugging Face tokenizer."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Transformers warns that config.json's model_type (gla) is not one it knows; the tokenizer files are
    # complete, so the warning is noise in a server's log.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    finally:
        hf_logging.set_verbosity(verbosity)
