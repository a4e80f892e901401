"""--activation-checkpointing none|full|selective over the transformer blocks (torchtitan's modes).

full:      each block keeps only its input; backward re-runs the whole block (one extra forward).
selective: each block keeps the outputs of its matrix multiplies and attention (the expensive ops),
           and recomputes the cheap elementwise ones (norms, rotary, SiLU, residual adds) in backward;
           torchtitan's op-level policy through torch.utils.checkpoint's selective contexts.

The block's forward is wrapped in place (like core.compiling.compile_modules), so state-dict keys and
module names do not change: checkpoints and exports read the same with or without it. Applied before
torch.compile, which traces the checkpoint as one region.
"""

from __future__ import annotations

import functools
import types
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from assay.core.errors import AssayError

MODES = ("none", "full", "selective")

# Outputs worth keeping: recomputing them costs a matmul; everything else is memory-bound and cheap.
_SAVED_OP_NAMES = (
    "mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
)
_SAVED_OPS = frozenset(getattr(torch.ops.aten, name).default for name in _SAVED_OP_NAMES if hasattr(torch.ops.aten, name))


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_wrapper(forward: Callable, mode: str) -> Callable:
    """`forward(self, *args)` (a block class's unbound forward) run under activation checkpointing."""
    if mode not in MODES:
        raise AssayError(f"unknown --activation-checkpointing {mode!r} (one of {', '.join(MODES)})")
    if mode == "none":
        return forward
    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls) if mode == "selective" else None

    @functools.wraps(forward)
    def run(module, *args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
            return forward(module, *args, **kwargs)
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        return checkpoint(forward, module, *args, use_reentrant=False, **extra, **kwargs)

    return run


def apply_activation_checkpointing(blocks: list[nn.Module], mode: str) -> None:
    """Wrap each block's forward for `mode` in place (eager; with --compile the trainer passes
    checkpoint_wrapper to compile_modules instead, so the checkpoint is inside the compiled region)."""
    wrapped_by_class: dict[type, Callable] = {}
    for block in blocks:
        cls = type(block)
        if cls not in wrapped_by_class:
            wrapped_by_class[cls] = checkpoint_wrapper(cls.forward, mode)
        block.forward = types.MethodType(wrapped_by_class[cls], block)
