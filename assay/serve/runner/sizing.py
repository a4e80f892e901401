"""How long a KV-cache slot is and whether the pool fits: the model's positions, the free memory, --max-len.

A fixed-state model's slot does not depend on the length at all; these functions matter for a KV cache,
whose pool is max_seqs + 1 slots of max_len positions, allocated whole at start-up.
"""

from __future__ import annotations

import logging
import os

import torch

from assay.core.device import free_memory_bytes
from assay.core.errors import AssayError
from assay.serve.runner.weights import SlotModel, state_dtype

log = logging.getLogger("assay.serve")

# The static pool is allocated (and zeroed) whole at start-up. Without --max-len it may take this share of
# the memory free then; the rest stays for activations, the compiler and other processes on the machine.
POOL_MEMORY_SHARE = 0.5
# On a CPU the pool shares RAM with everything else on the machine, so the fitted default also stops at this
# size (vLLM's CPU backend reserves 4 GiB of KV cache by default, VLLM_CPU_KVCACHE_SPACE).
CPU_POOL_BYTES = 4 * 2**30
# A pool given its size by the flags may take at most this share of the free memory: past it, the first
# prefill's activations would not fit beside it.
POOL_FIT_SHARE = 0.9
SLOT_LEN_GRAIN = 256  # a fitted slot length is rounded down to a multiple of this


def checkpoint_positions(path: str | os.PathLike) -> int | None:
    """The longest sequence the checkpoint's config says the model holds (its max_position_embeddings)."""
    from assay.models import registry
    from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

    config = read_hf_config(checkpoint_dir(path))
    spec = registry.find(config.get("model_type"))
    positions = getattr(spec.args_from_hf(config), "max_seq_len", None) if spec is not None else None
    return int(positions) if positions else None


def rope_scaled_positions(config: dict) -> int | None:
    """The positions a config.json's rope scaling stretches the model to: factor x
    original_max_position_embeddings (Transformers 5's rope_parameters, older files' rope_scaling; for a
    model with one rope per layer type, the largest). None without a factor and an original length: the
    scaling (if any) claims no positions past max_position_embeddings."""
    from collections.abc import Mapping

    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    entries = [entry for entry in rope.values() if isinstance(entry, Mapping)] or [rope]
    covered = [
        int(float(entry["factor"]) * int(entry["original_max_position_embeddings"]))
        for entry in entries
        if entry.get("factor") and entry.get("original_max_position_embeddings")
        and entry.get("rope_type", entry.get("type", "default")) != "default"
    ]
    return max(covered) if covered else None


def check_max_len(path: str | os.PathLike, max_len: int | None, flag: str = "--max-len") -> None:
    """--max-len past the checkpoint's positions is refused unless its rope scaling covers it: a KV slot of
    max_len positions would otherwise stretch the rotary table past what the model was trained for."""
    from assay.models import registry
    from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

    if max_len is None:
        return
    config = read_hf_config(checkpoint_dir(path))
    spec = registry.find(config.get("model_type"))
    if spec is None or not spec.cache.grows:  # a fixed state has no positions to run past
        return
    positions = checkpoint_positions(path)
    if positions is None or max_len <= positions:
        return
    scaled = rope_scaled_positions(config)
    if scaled is not None and max_len <= scaled:
        return
    covered = f"its rope scaling covers {scaled}" if scaled is not None else "config.json has no rope scaling that covers it"
    raise AssayError(f"{flag} {max_len} is past the model's {positions} positions (max_position_embeddings) and {covered}: "
                     f"use {flag} {max(positions, scaled or 0)} or less")


def fitted_slot_len(slot_model: SlotModel, slot_len: int, max_seqs: int, pool_dtype: str, device: torch.device) -> int:
    """The KV slot length without --max-len: slot_len (prompt + new tokens, already capped at the model's
    positions), shortened to what max_seqs + 1 slots can hold in POOL_MEMORY_SHARE of the free memory."""
    wanted = min(slot_len, slot_model.max_positions() or slot_len)
    free = free_memory_bytes(device)
    if free is None:
        return wanted
    per_position = slot_model.state_bytes_per_sequence(state_dtype(pool_dtype), 1)
    budget = int(POOL_MEMORY_SHARE * free)
    where = f"half of the {free / 2**30:.1f} GiB free"
    if device.type == "cpu" and budget > CPU_POOL_BYTES:
        budget, where = CPU_POOL_BYTES, f"the {CPU_POOL_BYTES / 2**30:.0f} GiB a CPU pool takes by default"
    fits = budget // ((max_seqs + 1) * per_position)
    if fits >= wanted:
        return wanted
    fitted = fits // SLOT_LEN_GRAIN * SLOT_LEN_GRAIN
    if fitted < SLOT_LEN_GRAIN:
        raise AssayError(
            f"{max_seqs} slots of a KV cache ({per_position} bytes per position each) leave under {SLOT_LEN_GRAIN} positions "
            f"per slot in {where}: lower --max-seqs (or give --max-len)"
        )
    return fitted


def check_pool_fits(slot_model: SlotModel, max_seqs: int, dtype: torch.dtype, max_len: int, device: torch.device) -> None:
    """Says what the pool will take (logged, before it is allocated); a pool over POOL_FIT_SHARE of the free
    memory fails here in one line naming the flags, not later as an out-of-memory kill."""
    free = free_memory_bytes(device)
    need = slot_model.state_bytes_per_sequence(dtype, max_len) * (max_seqs + 1)
    grows = slot_model.uses_max_len()
    shape = f"{max_seqs} slots + 1 scratch" + (f" x {max_len} positions" if grows else "")
    dtype_text = str(dtype).removeprefix("torch.")
    available = f"; {free / 2**30:.1f} GiB free" if free is not None else ""
    log.info(f"slot pool: {shape}, {'KV cache' if grows else 'fixed state'} in {dtype_text}: {_size(need)}{available}")
    if free is not None and need > POOL_FIT_SHARE * free:
        flags = "--max-seqs or --max-len" if grows else "--max-seqs (or --state-dtype bfloat16)"
        raise AssayError(
            f"the slot pool needs {need / 2**30:.3g} GiB ({shape}) but {device.type} has {free / 2**30:.1f} GiB free "
            f"(at most {POOL_FIT_SHARE:.0%} of it for the pool): lower {flags}"
        )


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= scale / 4:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes / 2**10:.3g} KiB"


__all__ = [
    "CPU_POOL_BYTES", "POOL_FIT_SHARE", "POOL_MEMORY_SHARE", "SLOT_LEN_GRAIN", "check_max_len", "check_pool_fits", "checkpoint_positions", "fitted_slot_len",
    "rope_scaled_positions",
]
