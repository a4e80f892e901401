"""Gated linear attention's operator (the kernel seam GLAOperator, kernel "gla_chunk") and the short
causal convolution fla puts before it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from assay.ops import gla_chunk, gla_step


class GLAOperator(nn.Module):
    """The gated-linear-attention recurrence over [B, T, H, D]: chunkwise in parallel, or one step."""

    def __init__(self, chunk_size: int):
        super().__init__()
        self.chunk_size = chunk_size

    def forward(self, q, k, v, g, initial_state=None, output_final_state=False):
        # q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] -> o [B, T, H, V], state or None
        return gla_chunk(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state, chunk_size=self.chunk_size)

    def step(self, q, k, v, g, state):
        # q, k, g: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] -> o [B, H, V], new state
        return gla_step(q, k, v, g, state)

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}"


class ShortConvolution(nn.Module):
    """A causal depthwise convolution over time, then SiLU: fla's ShortConvolution (activation "silu") on
    [B, T, D]. Each channel mixes its own last `kernel_size` inputs, so a token's q, k or v also carries
    its few predecessors: what lets a linear-attention layer write "this key followed that one" into its
    state (the recall probes' key -> value pairs), which a per-token projection cannot.

    weight [D, 1, W] (nn.Conv1d's layout, fla's checkpoint shape); bias [D] or none. Between calls the
    layer's state is its last W - 1 inputs, [B, W - 1, D] (zeros before the first token).
    """

    def __init__(self, width: int, kernel_size: int, bias: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(width, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        # nn.Conv1d's own initialisation (uniform, bound 1 / sqrt(kernel_size) for a depthwise filter): the
        # filter starts near a unit-gain average of the taps. fla draws it as its matrices, normal(0, std),
        # which at std 0.02-0.05 scales q, k and v down about 20-50x; the recall runs used this one.
        bound = 1.0 / math.sqrt(self.kernel_size)
        self.weight.uniform_(-bound, bound, generator=generator)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False):
        # x: [B, T, D]; state: [B, W - 1, D] or None (zeros) -> (y [B, T, D], the last W - 1 inputs or None)
        width = x.shape[-1]
        history = self.kernel_size - 1
        if state is None:
            padded = F.pad(x, (0, 0, history, 0))  # [B, W - 1 + T, D]
        else:
            padded = torch.cat([state.to(x.dtype), x], dim=1)
        y = F.conv1d(padded.transpose(1, 2), self.weight, self.bias, groups=width)  # [B, D, T]
        final = padded[:, padded.shape[1] - history:].contiguous() if output_final_state else None
        return F.silu(y.transpose(1, 2)), final

    def extra_repr(self) -> str:
        return f"width={self.weight.shape[0]}, kernel_size={self.kernel_size}, bias={self.bias is not None}"
