"""RMSNorm, as Transformers computes it: normalise in float32, then Llama's order (cast back, then scale
by `weight`) or Gemma's (scale by `1 + weight` in float32, then cast back: `unit_offset`)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        # unit_offset: the stored weight is the scale minus one (Gemma's checkpoints), so it starts at zero.
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        # Cast back, then scale: Transformers' Llama order, so bf16 rounding matches too.
        return self.weight * normed.to(x.dtype)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The identity scale: ones, or zeros under unit_offset."""
        self.weight.fill_(0.0 if self.unit_offset else 1.0)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (", unit_offset=True" if self.unit_offset else "")
