"""The slot pool: every sequence's decoding state lives in one row of preallocated tensors.

A GLA model's state is one [H, K, V] matrix per layer; a Qwen3's is its key/value cache rows. Either
way the engine allocates `max_seqs + 1` rows once, at start-up, and never again: a new request takes a
free row (a slot id), a finished one gives it back. Nothing is allocated per request or per token,
so memory is known before the first request arrives.

The last row is the scratch slot. A decode batch padded from 5 running sequences to a width of 8
fills its 3 padding rows with the scratch slot's id: they read and write that row and no other, so
padding never touches a real sequence's state (tested with NaN-filled free slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assay.core.errors import AssayError


@dataclass(frozen=True)
class PoolLayout:
    """What one row holds: a name per buffer (e.g. "layers.0.state") and its per-row shape and dtype."""

    names: tuple[str, ...]
    row_shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    def bytes_per_row(self) -> int:
        total = 0
        for shape, dtype in zip(self.row_shapes, self.dtypes):
            numel = 1
            for size in shape:
                numel *= size
            total += numel * torch.empty((), dtype=dtype).element_size()
        return total


class SlotPool:
    """`max_seqs` real slots plus one scratch slot, as a list of tensors with `max_seqs + 1` rows each."""

    def __init__(self, buffers: list[torch.Tensor], max_seqs: int):
        if max_seqs < 1:
            raise AssayError(f"max_seqs must be at least 1, got {max_seqs}")
        for buffer in buffers:
            if buffer.shape[0] != max_seqs + 1:
                raise ValueError(f"a pool buffer has {buffer.shape[0]} rows; expected max_seqs + 1 = {max_seqs + 1}")
        self.buffers = buffers
        self.max_seqs = max_seqs
        self.scratch_slot = max_seqs
        # Lowest ids first: a light load keeps reusing the same few rows (warm in cache).
        self._free: list[int] = list(range(max_seqs - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def used_slots(self) -> set[int]:
        return set(self._used)

    def free_slots(self) -> list[int]:
        return sorted(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free slot (the engine admits a request only when num_free > 0)")
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot not in self._used:
            raise RuntimeError(f"slot {slot} released twice or never allocated")
        self._used.remove(slot)
        self._free.append(slot)

    def copy_slot(self, source: int, targets: list[int]) -> None:
        """Copy row `source` of every buffer into rows `targets` (n choices of one prompt: prefilled once, then
        copied). Generic over buffers: a GLA's states and conv windows, a KV cache's keys and values alike."""
        if not targets:
            return
        index = torch.tensor(targets, dtype=torch.int64, device=self.buffers[0].device)
        for buffer in self.buffers:
            row = buffer[source].clone()  # the source row must not alias what is written
            buffer.index_copy_(0, index, row.unsqueeze(0).expand(len(targets), *row.shape))

    def bytes_per_slot(self) -> int:
        return sum(buffer[0].numel() * buffer.element_size() for buffer in self.buffers)

    def total_bytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self.buffers)
