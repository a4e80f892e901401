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
        # nn.Conv1d's own initialisation (uniform, bound 1 / sqrt(kernel_size) for a depthwise filter), as fla's
        # ShortConvolution (an nn.Conv1d) on its own. A model's init_weights then draws it as fla's model does,
        # normal(0, std) with a zero bias (assay.models.common.decoder).
        bound = 1.0 / math.sqrt(self.kernel_size)
        self.weight.uniform_(-bound, bound, generator=generator)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False,
                ends: torch.Tensor | None = None):
        # x: [B, T, D]; state: [B, W - 1, D] or None (zeros); ends: [B] int64 or None (T)
        # -> (y [B, T, D], the last W - 1 inputs before each row's end, or None)
        width = x.shape[-1]
        history = self.kernel_size - 1
        if state is None:
            padded = F.pad(x, (0, 0, history, 0))  # [B, W - 1 + T, D]
        else:
            padded = torch.cat([state.to(x.dtype), x], dim=1)
        weight, bias = _local(self.weight), _local(self.bias)  # under tensor parallelism: this rank's channels
        # y_t = sum_j w_j x_{t - W + 1 + j} (+ bias): W shifted multiply-adds in [B, T, D], what a depthwise conv1d
        # computes. Not F.conv1d: its CPU backward is slow for depthwise filters (forward + backward of one layer's
        # q at [64, 16, 64], W = 4, one thread: 1,390 us against 716 us here; [8, 512, 256]: 14.1 ms against 12.4).
        steps = x.shape[1]
        taps = weight.squeeze(1).t()  # [W, D]
        y = padded[:, :steps] * taps[0]
        for j in range(1, self.kernel_size):
            y = torch.addcmul(y, padded[:, j : j + steps], taps[j])
        if bias is not None:
            y = y + bias
        final = None
        if output_final_state and ends is None:
            final = padded[:, padded.shape[1] - history:].contiguous()
        elif output_final_state:
            # A right-padded row's window ends at its last real input (inputs ends..T-1 are pads): in padded
            # coordinates, inputs ends .. ends + W - 2.
            index = ends.view(-1, 1) + torch.arange(history, device=x.device)  # [B, W - 1]
            final = padded.gather(1, index.unsqueeze(-1).expand(-1, -1, width))
        return F.silu(y), final

    def extra_repr(self) -> str:
        return f"width={self.weight.shape[0]}, kernel_size={self.kernel_size}, bias={self.bias is not None}"


def _local(parameter):
    """A parameter sharded by tensor parallelism (assay.models.parallel.ChannelwiseParallel) computes with
    this rank's part; anything else as it is. No torch.distributed import here: the shard says how."""
    to_local = getattr(parameter, "to_local", None)
    return parameter if to_local is None else to_local()
