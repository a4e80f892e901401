"""Rotary embedding in Triton, kernel layout [batch, heads, seq, head_dim] (any strides).

One program rotates BLOCK_T positions of one (batch, head) row: it loads both halves of each
position and the matching rows of the float32 cos/sin cache, computes in float32 and writes the
output once. Backward is the same kernel with the rotation reversed (BACKWARD=True), reading the
cache forward used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from assay.kernels.triton_common import device_guard, launch_options, out_code, round_to_output

BLOCK_T = 16


@triton.jit
def _rope_kernel(
    x_ptr, out_ptr, cos_ptr, sin_ptr,
    heads, seq_len, half,
    sx_b, sx_h, sx_t, sx_d,
    so_b, so_h, so_t, so_d,
    sc_t, sc_d,
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    row = tl.program_id(0)  # batch * heads + head
    batch, head = row // heads, row % heads
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_HALF)
    mask = (t[:, None] < seq_len) & (d[None, :] < half)

    x_row = x_ptr + batch * sx_b + head * sx_h + t[:, None] * sx_t
    x1 = tl.load(x_row + d[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (d[None, :] + half) * sx_d, mask=mask, other=0.0).to(tl.float32)
    cache = t[:, None] * sc_t
    c1 = tl.load(cos_ptr + cache + d[None, :] * sc_d, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + cache + (d[None, :] + half) * sc_d, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + cache + d[None, :] * sc_d, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + cache + (d[None, :] + half) * sc_d, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        # x = rotate(y) transposed: dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1 (PyTorch autograd's order)
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        # y = x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1)
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    out_row = out_ptr + batch * so_b + head * so_h + t[:, None] * so_t
    tl.store(out_row + d[None, :] * so_d, round_to_output(y1, OUT_DTYPE), mask=mask)
    tl.store(out_row + (d[None, :] + half) * so_d, round_to_output(y2, OUT_DTYPE), mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [T, D] -> [B, H, T, D], laid out like x
    batch, heads, seq_len, head_dim = x.shape
    half = head_dim // 2
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    grid = (batch * heads, triton.cdiv(seq_len, BLOCK_T))
    with device_guard(x):
        _rope_kernel[grid](
            x, out, cos, sin,
            heads, seq_len, half,
            *x.stride(), *out.stride(), *cos.stride(),
            BLOCK_T=BLOCK_T, BLOCK_HALF=triton.next_power_of_2(half), BACKWARD=backward, OUT_DTYPE=out_code(x.dtype),
            **launch_options(),
        )
    return out


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _rotate(q, cos, sin, backward=False), _rotate(k, cos, sin, backward=False)


def rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _rotate(grad_q, cos, sin, backward=True), _rotate(grad_k, cos, sin, backward=True)
