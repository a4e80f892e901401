"""One adapter per architecture: how the engine loads a model, lays out its per-sequence state in the
slot pool, prefills one prompt into a slot and decodes a batch of slots by one token.

The registry is keyed by config.json's `model_type`, so `Engine.from_checkpoint` needs nothing but the
folder. Two entries:
  gla    the fixed-state model: one float32 (or bfloat16) [H, K, V] matrix per layer and slot, whatever
         the length; prefill through the chunked form (gla_chunk), decode through the recurrent step.
  qwen3  a transformer with a key/value cache per slot: [max_len, Hkv, D] per layer for k and for v,
         sized for the longest sequence the engine accepts; what the GLA's constant state is compared to.

Every decode is `decode(tokens [W, 1], slot_ids [W], positions [W], buffers) -> logits [W, vocab]`: the
function the engine compiles once per width. It gathers its rows from the pool, runs the model's step
and writes the rows back in place; padding rows carry the scratch slot's id.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from assay.core.dtypes import dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.models.memory import kv_cache_bytes_per_sequence

STATE_DTYPES = ("float32", "bfloat16")  # what a slot pool stores (aliases bf16, fp32 accepted)
# The "transformer of the same size" is compared in bfloat16, the dtype such caches are served in.
KV_REFERENCE_DTYPE = torch.bfloat16
KV_REFERENCE_LENGTHS = (2048, 8192)


def state_dtype(name: str) -> torch.dtype:
    canonical = dtype_name(name, STATE_DTYPES)
    if canonical is None:
        raise AssayError(f"state dtype {name!r}: expected float32 or bfloat16")
    return torch_dtype(canonical)


@dataclass(frozen=True)
class KVLayout:
    """The attention shape whose key/value cache a sequence's state is compared with."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    note: str

    def bytes_per_sequence(self, seq_len: int, dtype: torch.dtype = KV_REFERENCE_DTYPE) -> int:
        return kv_cache_bytes_per_sequence(self.n_layers, self.n_kv_heads, self.head_dim, seq_len, dtype)


class ModelAdapter(ABC):
    """What the engine needs from an architecture. Subclasses hold the loaded model as `self.model`."""

    model_type: str = ""
    model: nn.Module

    @abstractmethod
    def pool_buffers(self, n_rows: int, dtype: torch.dtype, max_len: int) -> list[torch.Tensor]:
        """Zeroed per-slot state: a list of tensors, each with n_rows rows (max_seqs + 1 with the scratch slot)."""
        ...

    @abstractmethod
    def prefill(self, tokens: torch.Tensor, slot: int, buffers: list[torch.Tensor]) -> torch.Tensor:
        """tokens [1, T] of one fresh sequence -> logits [vocab] at its last position; its state written to row `slot`."""
        ...

    @abstractmethod
    def decode(self, tokens: torch.Tensor, slot_ids: torch.Tensor, positions: torch.Tensor, buffers: list[torch.Tensor]) -> torch.Tensor:
        """tokens [W, 1], slot_ids [W], positions [W] (of each token) -> logits [W, vocab]; rows updated in place."""
        ...

    @abstractmethod
    def state_bytes_per_sequence(self, dtype: torch.dtype, max_len: int) -> int:
        ...

    @abstractmethod
    def kv_reference(self) -> KVLayout:
        ...

    def uses_max_len(self) -> bool:
        """True when the pool's size depends on the longest sequence (a KV cache), False for a fixed state."""
        return False


class GLAAdapter(ModelAdapter):
    model_type = "gla"

    def __init__(self, model, args):
        self.model, self.args = model, args

    @classmethod
    def load(cls, folder: Path, device: torch.device, max_len: int) -> GLAAdapter:
        from assay.models.gla import load_native_gla

        model, args = load_native_gla(folder, device=device)
        return cls(model.eval(), args)

    def pool_buffers(self, n_rows, dtype, max_len):
        args, device = self.args, self.model.tok_embeddings.weight.device
        return [torch.zeros(n_rows, args.n_heads, args.head_k_dim, args.head_v_dim, dtype=dtype, device=device) for _ in range(args.n_layers)]

    def prefill(self, tokens, slot, buffers):
        # tokens: [1, T] -> logits [vocab]; the final state of each layer lands in row `slot`
        logits, state = self.model.prefill(tokens)
        for buffer, layer_state in zip(buffers, state):
            buffer[slot].copy_(layer_state[0])
        return logits[0, -1]

    def decode(self, tokens, slot_ids, positions, buffers):
        # tokens: [W, 1]; slot_ids: [W]; positions unused (a GLA state carries no position) -> logits [W, vocab]
        # The recurrence runs in float32 whatever the pool stores: a bfloat16 pool rounds only what it keeps.
        state = [buffer.index_select(0, slot_ids).float() for buffer in buffers]  # per layer [W, H, K, V]
        logits, new_state = self.model.decode_step(tokens, state)
        for buffer, layer_state in zip(buffers, new_state):
            buffer.index_copy_(0, slot_ids, layer_state.to(buffer.dtype))
        return logits[:, 0]

    def state_bytes_per_sequence(self, dtype, max_len):
        from assay.models.gla import state_bytes_per_sequence

        return state_bytes_per_sequence(self.args, dtype)

    def kv_reference(self):
        # A transformer of the same size: same depth and width, multi-head attention with the GLA's head
        # count and dim / heads per head (no grouped-query sharing), so each token keeps 2 x dim values
        # per layer. For the 3B flavour that is 24 layers x 2 x 3072, as docs/gla.md's 24 heads of 128.
        args = self.args
        return KVLayout(args.n_layers, args.n_heads, args.dim // args.n_heads, f"MHA, {args.n_heads} heads x {args.dim // args.n_heads}")


class Qwen3Adapter(ModelAdapter):
    model_type = "qwen3"

    def __init__(self, model, args):
        self.model, self.args = model, args

    @classmethod
    def load(cls, folder: Path, device: torch.device, max_len: int) -> Qwen3Adapter:
        from assay.models.qwen3 import load_native_qwen3
        from assay.models.qwen3.model import Qwen3

        if not hasattr(Qwen3, "init_kv_cache"):
            raise AssayError("this assay's native Qwen3 has no KV-cache decoding (Qwen3.init_kv_cache) yet")
        # The rotary table must reach the last position a slot can hold.
        model, args = load_native_qwen3(folder, device=device)
        if args.max_seq_len < max_len:
            model, args = load_native_qwen3(folder, {"max_seq_len": max_len}, device=device)
        return cls(model.eval(), args)

    def _kv_cache(self, buffers):
        return list(zip(buffers[0::2], buffers[1::2]))

    def pool_buffers(self, n_rows, dtype, max_len):
        buffers = []
        for keys, values in self.model.init_kv_cache(n_rows, max_len, dtype=dtype):
            buffers += [keys, values]
        return buffers

    def prefill(self, tokens, slot, buffers):
        # tokens: [1, T] -> logits [vocab]; keys/values of positions 0..T-1 land in row `slot`
        slot_ids = torch.tensor([slot], dtype=torch.int64, device=tokens.device)
        return self.model.prefill(tokens, self._kv_cache(buffers), slot_ids)[0, -1]

    def decode(self, tokens, slot_ids, positions, buffers):
        # tokens: [W, 1]; slot_ids, positions: [W] -> logits [W, vocab]; each row's k/v written at its position
        return self.model.decode_step(tokens, self._kv_cache(buffers), slot_ids, positions)[:, 0]

    def state_bytes_per_sequence(self, dtype, max_len):
        args = self.args
        return kv_cache_bytes_per_sequence(args.n_layers, args.n_kv_heads, args.head_dim, max_len, dtype)

    def kv_reference(self):
        args = self.args
        return KVLayout(args.n_layers, args.n_kv_heads, args.head_dim, f"its own cache, {args.n_kv_heads} kv heads x {args.head_dim}")

    def uses_max_len(self) -> bool:
        return True


ADAPTERS: dict[str, Callable[[Path, torch.device, int], ModelAdapter]] = {
    "gla": GLAAdapter.load,
    "qwen3": Qwen3Adapter.load,
}


def model_type_of(folder: str | os.PathLike) -> str:
    from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

    config = read_hf_config(checkpoint_dir(folder))
    return str(config.get("model_type", ""))


def load_adapter(folder: str | os.PathLike, device: torch.device, max_len: int) -> ModelAdapter:
    """The adapter for the checkpoint's config.json model_type; AssayError for an architecture not served."""
    from assay.models.hf_checkpoint import checkpoint_dir

    path = checkpoint_dir(folder)
    model_type = model_type_of(path)
    if model_type not in ADAPTERS:
        raise AssayError(f"{folder}: model_type {model_type!r} is not served (served: {', '.join(sorted(ADAPTERS))})")
    return ADAPTERS[model_type](Path(path), device, max_len)
