"""Slot models: a loaded native model seen through its per-sequence state in the serving engine's slot pool.
A slot model prefills a right-padded batch of prompts (or later chunks of them) into slots and decodes a
batch of slots by one token.

Two kinds, chosen by an architecture's registry entry (never by asking which architecture it is), each over
a model that keeps one of the two decode contracts (the Protocols below):
  StateSlotModel    a FixedStateModel (GLA): one [H, K, V] matrix per layer and slot, whatever the length;
                    prefill through the chunked form, decode through the recurrent step.
  KVCacheSlotModel  a KVCacheModel (any KVCacheDecodingMixin model: Qwen3, Llama, Gemma 3): [max_len, Hkv, D]
                    per layer for k and for v, a sliding-window layer a ring of [min(window, max_len), Hkv, D].

Every decode is `decode(tokens [W, 1], slot_ids [W], positions [W], buffers) -> logits [W, vocab]`: the
function the engine compiles once per width. It gathers its rows from the pool, runs the model's step
and writes the rows back in place; padding rows carry the scratch slot's id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from assay.models.common.feed_forward import GroupedExperts
from assay.models.common.kv_cache import LIVE_GRAIN  # an eager KV decode's view of the pool grows in steps of this
from assay.models.memory import kv_cache_bytes_per_sequence, linear_state_bytes_per_sequence

if TYPE_CHECKING:
    from assay.models.registry import ArchSpec

# The "transformer of the same size" is compared in bfloat16, the dtype such caches are served in.
KV_REFERENCE_DTYPE = torch.bfloat16


class FixedStateModel(Protocol):
    """The decode contract of a fixed-state model: its state is a list of tensors per sequence, the same size
    however long the sequence (per layer [B, H, K, V], then any conv windows)."""

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Per-sequence shape of each state tensor."""
        ...

    def prefill(self, tokens: torch.Tensor, state: list[torch.Tensor] | None = None, mask: torch.Tensor | None = None,
                logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens [B, T] (state None: zeros) -> (logits [B, T, vocab], or [B, 1, vocab] at logits_at; the state after them)."""
        ...

    def decode_step(self, tokens: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens [B, 1] -> (logits [B, 1, vocab], the state after them)."""
        ...


class KVCacheModel(Protocol):
    """The decode contract of a KV-cache model (assay.models.common.kv_cache.KVCacheDecodingMixin): a static
    cache of (keys, values) per layer with one row per slot, written in place at each token's position."""

    def init_kv_cache(self, n_rows: int, max_len: int, dtype: torch.dtype | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ...

    def prefill_batch(self, tokens: torch.Tensor, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], slot_ids: torch.Tensor,
                      lengths: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                      all_logits: bool = False) -> torch.Tensor:
        """tokens [B, T] right-padded into rows slot_ids -> logits (as SlotModel.prefill_batch)."""
        ...

    def decode_step(self, tokens: torch.Tensor, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], slot_ids: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
        """tokens [W, 1] at positions [W] of rows slot_ids [W] -> logits [W, 1, vocab]."""
        ...


@dataclass(frozen=True)
class KVLayout:
    """The attention shape whose key/value cache a sequence's state is compared with."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    note: str
    windows: tuple[int | None, ...] = ()  # per layer, the positions a sliding-window layer keeps at most (None: all)

    def bytes_per_sequence(self, seq_len: int, dtype: torch.dtype = KV_REFERENCE_DTYPE) -> int:
        kept = [seq_len if window is None else min(window, seq_len) for window in self.windows or (None,) * self.n_layers]
        return sum(kv_cache_bytes_per_sequence(1, self.n_kv_heads, self.head_dim, positions, dtype) for positions in kept)


class SlotModel(ABC):
    """What the serving engine needs from an architecture. Subclasses hold the loaded model as `self.model`."""

    model_type: str = ""
    model: nn.Module

    # Whether prefill_batch traces as one graph with the rows and the length dynamic (a compiled engine then
    # compiles it: serve/runner/compiled_prefill.py); otherwise a compiled engine prefills eagerly.
    compiles_prefill = False

    def __init__(self, model: nn.Module, args: Any, model_type: str = ""):
        self.model, self.args, self.model_type = model, args, model_type

    @classmethod
    def load(cls, spec: ArchSpec, folder: Path, device: torch.device, max_len: int) -> SlotModel:
        """The checkpoint's native model in eval mode, ready for sequences up to max_len tokens."""
        model, args = spec.load(folder, device=device, dtype=torch.float32)
        return cls(model.eval(), args, spec.name)

    @abstractmethod
    def pool_buffers(self, n_rows: int, dtype: torch.dtype, max_len: int) -> list[torch.Tensor]:
        """Zeroed per-slot state: a list of tensors, each with n_rows rows (max_seqs + 1 with the scratch slot)."""
        ...

    @abstractmethod
    def prefill_batch(self, tokens, slot_ids, buffers, *, lengths=None, start_positions=None, all_logits=False):
        """tokens [B, T] int64, RIGHT-padded: row b's real tokens are tokens[b, :lengths[b]] (lengths None: all T).
        slot_ids [B] int64: each row's slot in the pool.
        start_positions [B] int64 (None: zeros): tokens of row b's sequence already in its slot. 0 = a fresh
          sequence (its slot's old contents are ignored/reset); > 0 = a later chunk of a chunked prefill that
          continues from the slot's state (KV: attends to cache positions < start; GLA: starts from the
          slot's recurrent state and conv window).
        Returns float32 logits [B, vocab] at each row's last real token, or [B, T, vocab] when all_logits
        (pad positions: unspecified).
        Writes row b's state for positions start..start+len-1 into slot slot_ids[b]; pad positions leave
        the slot exactly as the real tokens left it (no KV write beyond start+len that could ever be read,
        no write past the slot's end; GLA: state and conv window untouched by pads)."""
        ...

    def prefill(self, tokens: torch.Tensor, slot: int, buffers: list[torch.Tensor], *, all_logits: bool = False) -> torch.Tensor:
        """tokens [1, T] of one fresh sequence -> logits [vocab] at its last position ([T, vocab] at every
        position with all_logits: a prompt's own log-probabilities); its state written to row `slot`."""
        slot_ids = torch.tensor([slot], dtype=torch.int64, device=tokens.device)
        return self.prefill_batch(tokens, slot_ids, buffers, all_logits=all_logits)[0]

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

    def max_positions(self) -> int | None:
        """The longest sequence the loaded model can hold (its rotary table), None when unbounded."""
        return None

    def live_buffers(self, buffers: list[torch.Tensor], positions: int) -> list[torch.Tensor]:
        """Views of the pool an uncompiled decode needs when no slot holds more than `positions` positions:
        the pool itself here (a fixed state has no positions to leave out)."""
        return buffers


class StateSlotModel(SlotModel):
    """A FixedStateModel in the slot pool: its state tensors are the pool's buffers."""

    model: FixedStateModel
    # Not compiled: GLA's chunked recurrence (both of its forms, a torch.cond) with a dynamic length took 137-165 s
    # to trace per graph under aot_eager on 2 cores, and four graphs would be needed.

    def pool_buffers(self, n_rows, dtype, max_len):
        # One buffer per state tensor (the model's state_shapes: per layer [H, K, V], then any conv states).
        device = self.model.tok_embeddings.weight.device
        return [torch.zeros(n_rows, *shape, dtype=dtype, device=device) for shape in self.model.state_shapes()]

    def prefill_batch(self, tokens, slot_ids, buffers, *, lengths=None, start_positions=None, all_logits=False):
        # tokens: [B, T] right-padded; slot_ids, lengths, start_positions: [B] -> logits [B, vocab] or [B, T, vocab]
        # One pass over the batch: rows that continue a sequence start from their slot's state and conv window,
        # fresh rows from zeros; the pad mask keeps pads out of both (GLA.prefill), so each row's slot ends
        # as its real tokens leave it. The recurrence runs in float32 whatever the pool stores.
        batch, time = tokens.shape
        device = tokens.device
        lengths = torch.full((batch,), time, device=device) if lengths is None else torch.as_tensor(lengths, device=device)
        mask = None if bool((lengths == time).all()) else torch.arange(time, device=device).view(1, -1) < lengths.view(-1, 1)
        state = [buffer.index_select(0, slot_ids).float() for buffer in buffers]
        if start_positions is None:
            state = None  # every row fresh
        else:
            fresh = torch.as_tensor(start_positions, device=device) == 0  # [B]
            state = [layer.masked_fill(fresh.view(-1, *[1] * (layer.dim() - 1)), 0.0) for layer in state]
        last = (lengths - 1).clamp(min=0)
        logits, state = self.model.prefill(tokens, state, mask=mask, logits_at=None if all_logits else last)
        for buffer, layer_state in zip(buffers, state):
            buffer.index_copy_(0, slot_ids, layer_state.to(buffer.dtype))
        return logits.float() if all_logits else logits[:, 0].float()

    def decode(self, tokens, slot_ids, positions, buffers):
        # tokens: [W, 1]; slot_ids: [W]; positions unused (a state carries no position) -> logits [W, vocab]
        # The recurrence runs in float32 whatever the pool stores: a bfloat16 pool rounds only what it keeps.
        state = [buffer.index_select(0, slot_ids).float() for buffer in buffers]  # per layer [W, H, K, V] (+ conv states)
        logits, new_state = self.model.decode_step(tokens, state)
        for buffer, layer_state in zip(buffers, new_state):
            buffer.index_copy_(0, slot_ids, layer_state.to(buffer.dtype))
        return logits[:, 0].float()  # float32 whatever the weights (--dtype bfloat16)

    def state_bytes_per_sequence(self, dtype, max_len):
        return state_bytes(self.args, max_len, dtype)

    def kv_reference(self):
        # A transformer of the same size: same depth and width, multi-head attention with the model's head
        # count and dim / heads per head (no grouped-query sharing), so each token keeps 2 x dim values
        # per layer. For the 3B GLA flavour that is 24 layers x 2 x 3072, as docs/gla.md's 24 heads of 128.
        args = self.args
        return KVLayout(args.n_layers, args.n_heads, args.dim // args.n_heads, f"MHA, {args.n_heads} heads x {args.dim // args.n_heads}")


class KVCacheSlotModel(SlotModel):
    """A KVCacheModel in the slot pool: its keys and values are the pool's buffers (k, v, k, v, ...)."""

    model: KVCacheModel

    @property
    def compiles_prefill(self) -> bool:
        # Dense models trace whole. A mixture of experts routes with a host sync per layer (GroupedExperts'
        # counts.tolist()): graph breaks, and new graphs at new token counts (60 graphs for eight calls, measured).
        return not any(isinstance(module, GroupedExperts) for module in self.model.modules())

    @classmethod
    def load(cls, spec, folder, device, max_len):
        model, args = spec.load(folder, device=device, dtype=torch.float32)
        if args.max_seq_len < max_len:  # the rotary table must reach the last position a slot can hold
            model, args = spec.load(folder, {"max_seq_len": max_len}, device=device, dtype=torch.float32)
        return cls(model.eval(), args, spec.name)

    def _kv_cache(self, buffers):
        return list(zip(buffers[0::2], buffers[1::2]))

    def pool_buffers(self, n_rows, dtype, max_len):
        buffers = []
        for keys, values in self.model.init_kv_cache(n_rows, max_len, dtype=dtype):
            buffers += [keys, values]
        return buffers

    def prefill_batch(self, tokens, slot_ids, buffers, *, lengths=None, start_positions=None, all_logits=False):
        # One pass over the padded batch (KVCacheDecodingMixin.prefill_batch): one attention call per layer.
        return self.model.prefill_batch(tokens, self._kv_cache(buffers), slot_ids, lengths=lengths,
                                        start_positions=start_positions, all_logits=all_logits)

    def live_buffers(self, buffers, positions):
        # A decode gathers its rows' whole [L, Hkv, D] k and v in every layer: at L = 2,064 and 16 rows that is
        # 1.5 GB copied per step for SmolLM2, most of it positions no row holds yet. While no row has passed
        # `positions`, a ring has not wrapped and the first `positions` entries are all a row can see, so a
        # view of them (rounded up to LIVE_GRAIN: few distinct shapes) decodes to the same logits. Eager only:
        # a compiled decode would recompile at each new length.
        live = min(-(-positions // LIVE_GRAIN) * LIVE_GRAIN, max(buffer.shape[1] for buffer in buffers))
        return [buffer[:, :live] if buffer.shape[1] > live else buffer for buffer in buffers]

    def decode(self, tokens, slot_ids, positions, buffers):
        # tokens: [W, 1]; slot_ids, positions: [W] -> logits [W, vocab]; each row's k/v written at its position
        return self.model.decode_step(tokens, self._kv_cache(buffers), slot_ids, positions)[:, 0].float()  # float32 whatever the weights

    def state_bytes_per_sequence(self, dtype, max_len):
        return kv_bytes(self.args, max_len, dtype)

    def kv_reference(self):
        args = self.args
        windows = tuple(args.layer_window(layer) for layer in range(args.n_layers))
        note = f"its own cache, {args.n_kv_heads} kv heads x {args.head_dim}"
        if any(windows):
            note += f", {sum(w is not None for w in windows)} of {args.n_layers} layers a window of {max(w or 0 for w in windows)}"
        return KVLayout(args.n_layers, args.n_kv_heads, args.head_dim, note, windows)

    def uses_max_len(self) -> bool:
        return True

    def max_positions(self) -> int | None:
        return int(self.args.max_seq_len)


def kv_bytes(args: Any, seq_len: int, dtype: torch.dtype) -> int:
    """A KV-cache model's keys and values for seq_len tokens (args with n_layers, n_kv_heads, head_dim and
    layer_window): what its slot keeps, a sliding-window layer at most its window."""
    windows = tuple(args.layer_window(layer) for layer in range(args.n_layers))
    return KVLayout(args.n_layers, args.n_kv_heads, args.head_dim, "", windows).bytes_per_sequence(seq_len, dtype)


def state_bytes(args: Any, seq_len: int, dtype: torch.dtype) -> int:
    """A fixed-state model's state (args with n_layers, n_heads, head_k_dim, head_v_dim, and optionally
    use_short_conv, conv_size, conv_state_dim); seq_len plays no part."""
    conv = (args.conv_size - 1) * args.conv_state_dim if getattr(args, "use_short_conv", False) else 0
    return linear_state_bytes_per_sequence(args.n_layers, args.n_heads, args.head_k_dim, args.head_v_dim, dtype, conv)


@dataclass(frozen=True)
class DecodeMemory:
    """How an architecture keeps a sequence's history while decoding: its kind, the slot model that holds it,
    and its bytes per sequence."""

    kind: str  # "kv_cache" (grows with the sequence) or "state" (fixed size)
    slot_model: type[SlotModel]
    bytes_per_sequence: Any  # (args, seq_len, dtype) -> bytes

    @property
    def grows(self) -> bool:
        return self.kind == "kv_cache"


KV_CACHE = DecodeMemory("kv_cache", KVCacheSlotModel, kv_bytes)
FIXED_STATE = DecodeMemory("state", StateSlotModel, state_bytes)
