"""Rotary position embeddings: the cos/sin tables (with Llama 3's frequency scaling), rotate-half
application at shared or per-row positions, and the kernel seam RotaryEmbedding (kernel "rope")."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent rotary scaling (rope_type "llama3"): long wavelengths are divided by
    `factor`, short ones kept, the band between interpolated. factor 1 with no band is the plain rotary."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """Transformers' _compute_llama3_parameters."""
        low_freq_wavelen = self.original_max_position_embeddings / self.low_freq_factor
        high_freq_wavelen = self.original_max_position_embeddings / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        in_band = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(in_band, smoothed, scaled)


@dataclass(frozen=True)
class LinearRopeScaling:
    """Position interpolation (rope_type "linear", Gemma 3's global layers from 4B up): every frequency / factor."""

    factor: float

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq / self.factor


def rotary_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | LinearRopeScaling | None = None, device=None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, scaled when a scaling is given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    return inv_freq if scaling is None else scaling.scale(inv_freq)


def rotary_cos_sin(
    head_dim: int, max_seq_len: int, theta: float, device=None, scaling: RopeScaling | LinearRopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_seq_len, head_dim], float32, each frequency repeated in both halves (HF layout)."""
    inv_freq = rotary_inv_freq(head_dim, theta, scaling, device)
    positions = torch.arange(max_seq_len, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary at per-row positions. q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [B, T, D] (float32)."""
    cos = cos[:, :, None, :].to(q.dtype)
    sin = sin[:, :, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RotaryEmbedding(nn.Module):
    """Applies the rotary embedding; the cos/sin cache lives on the model root (one copy for all layers)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [T, D]
        cos = cos[None, :, None, :].to(q.dtype)
        sin = sin[None, :, None, :].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
