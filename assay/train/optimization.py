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


def adamw_implementation(parameters: list[torch.Tensor]) -> str:
    """"fused" (one multi-tensor kernel per step) when every parameter is a plain float tensor on one
    device, "foreach" when every one is a DTensor (FSDP/TP), else "for-loop".

    Why: the per-tensor loop costs a dispatch per parameter per op (profiled: AdamW's lerp_/mul_/add_ over
    every tensor, docs/training.md); a foreach group must hold one kind of tensor, and a TP layout mixes
    DTensors with plain ones (norm weights stay replicated as plain tensors on some plans).
    """
    from torch.distributed.tensor import DTensor

    is_dtensor = [isinstance(p, DTensor) for p in parameters]
    if parameters and all(is_dtensor):
        return "foreach"
    if any(is_dtensor) or not parameters:
        return "for-loop"
    devices = {p.device.type for p in parameters}
    if len(devices) == 1 and devices <= {"cpu", "cuda", "xpu", "mps"} and all(p.dtype.is_floating_point for p in parameters):
        return "fused"
    return "foreach"


def build_optimizer(model: nn.Module, config: OptimConfig, total_steps: int):
    parameters = list(model.parameters())
    implementation = adamw_implementation(parameters)
    optimizer = torch.optim.AdamW(
        parameters, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, weight_decay=config.weight_decay,
        foreach=implementation == "foreach", fused=implementation == "fused" or None,
    )
    optimizer.implementation = implementation  # reported in the trainer's summary
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, config.warmup_steps, config.min_lr_ratio)
    )
    return optimizer, scheduler


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Global L2 norm of all gradients (before clipping) as a float; see clip_grad_norm_tensor."""
    return float(clip_grad_norm_tensor(parameters, max_norm))


def clip_grad_norm_tensor(parameters, max_norm: float) -> torch.Tensor:
    """Global L2 norm of all gradients (before clipping), a 0-d float32 tensor, with no host sync; the
    gradients are scaled to max_norm when the norm is above it (a non-finite norm leaves them as they are:
    the trainer stops before the optimizer reads them).

    Works on any mix of plain tensors and DTensors (FSDP shards, TP shards, replicated): each
    DTensor's norm is reduced to its full value first, where torch.nn.utils.clip_grad_norm_ needs
    all gradients of one kind. Plain gradients go through torch._foreach_norm / _foreach_mul_ (one call
    for all of them instead of one per tensor), and the clip factor stays on the device: the trainer
    reads the norm together with the loss in one transfer.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    plain = [grad for grad in grads if not isinstance(grad, DTensor)]
    squares = []
    if plain:
        squares.extend(norm.pow(2) for norm in torch._foreach_norm(plain, 2, dtype=torch.float32))
    for grad in grads:
        if isinstance(grad, DTensor):
            squares.append(torch.linalg.vector_norm(grad, 2, dtype=torch.float32).full_tensor().pow(2))
    total = torch.stack([square.to(squares[0].device) for square in squares]).sum().sqrt()
    if max_norm <= 0:
        return total
    if total.device.type == "cpu":
        # Nothing to wait for on the host: read the norm and skip the multiply when no clipping is needed.
        norm = float(total)
        if not (math.isfinite(norm) and norm > max_norm):
            return total
        scale: float | torch.Tensor = max_norm / (norm + 1e-6)
    else:
        # On an accelerator the factor stays on the device (no sync): min(1, max_norm / norm), 1 for nan/inf.
        scale = torch.where(torch.isfinite(total) & (total > max_norm), max_norm / (total + 1e-6), torch.ones_like(total))
    if plain:
        torch._foreach_mul_(plain, scale if isinstance(scale, float) else scale.to(plain[0].device, plain[0].dtype))
    for grad in grads:
        if isinstance(grad, DTensor):
            grad.mul_(scale if isinstance(scale, float) else float(scale))
    return total
