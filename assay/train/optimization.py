"""AdamW, the warmup + cosine learning-rate schedule and gradient clipping: the same for every model path."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    warmup_steps: int = 1
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping


def lr_factor(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the base LR for 0-based `step`: linear warmup to 1, then cosine down to min_lr_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, config: OptimConfig, total_steps: int):
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, weight_decay=config.weight_decay,
        # Under tensor parallelism some parameters are DTensors and some plain tensors; the per-tensor
        # loop handles that mix (foreach groups would have to match), and tiny models lose nothing.
        foreach=False,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, config.warmup_steps, config.min_lr_ratio)
    )
    return optimizer, scheduler


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Global L2 norm of all gradients (before clipping), then scale them to max_norm if above it.

    Works on any mix of plain tensors and DTensors (FSDP shards, TP shards, replicated): each
    DTensor's norm is reduced to its full value first, where torch.nn.utils.clip_grad_norm_ needs
    all gradients of one kind.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    squares = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2, dtype=torch.float32)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.pow(2))
    total = float(torch.stack(squares).sum().sqrt())
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for grad in grads:
            grad.mul_(scale)
    return total
