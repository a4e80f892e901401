"""Grouped matrix multiplies in Triton for the mixture-of-experts kernel (rows sorted by expert).

`offsets[e]` is the end row of expert e's group (cumulative counts, int32), as torch._grouped_mm takes it.

  grouped_mm(a [M, K], b [E, K, N])        -> [M, N]     rows of group e times b[e]
  grouped_mm_weight(g [M, P], a [M, Q])    -> [E, P, Q]  g_e^T a_e over the rows of group e

Tiles never straddle two experts: grouped_mm launches cdiv(M, BLOCK_M) + E row tiles (an upper
bound on the tiles the groups need, known without reading the counts on the host) and each program
finds its expert by walking the offsets; the spare programs return at once. Accumulation is float32;
float32 inputs multiply in full precision (triton_common.dot_mode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from assay.kernels.triton_common import device_guard, dot, dot_mode, launch_options, out_code, round_to_output

BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32


@triton.jit
def _grouped_mm_kernel(
    a_ptr, b_ptr, c_ptr, offsets_ptr,
    n_experts, N, K,
    sa_m, sa_k, sb_e, sb_k, sb_n, sc_m, sc_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    # Which expert this row tile belongs to, and where its rows start and end.
    expert = pid_m * 0 - 1
    row_start = pid_m * 0
    row_end = pid_m * 0
    tiles_before = pid_m * 0
    group_start = pid_m * 0
    for e in range(0, n_experts):
        group_end = tl.load(offsets_ptr + e)
        tiles = (group_end - group_start + BLOCK_M - 1) // BLOCK_M
        hit = (pid_m >= tiles_before) & (pid_m < tiles_before + tiles)
        expert = tl.where(hit, e, expert)
        row_start = tl.where(hit, group_start + (pid_m - tiles_before) * BLOCK_M, row_start)
        row_end = tl.where(hit, group_end, row_end)
        tiles_before += tiles
        group_start = group_end
    if expert >= 0:
        rm = row_start + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * sa_m + rk[None, :] * sa_k, mask=(rm[:, None] < row_end) & (rk[None, :] < K), other=0.0)
            b = tl.load(
                b_ptr + expert * sb_e + rk[:, None] * sb_k + rn[None, :] * sb_n, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0
            )
            acc = dot(a, b, acc, DOT_MODE)
        mask = (rm[:, None] < row_end) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * sc_m + rn[None, :] * sc_n, round_to_output(acc, OUT_DTYPE), mask=mask)


@triton.jit
def _grouped_mm_weight_kernel(
    g_ptr, a_ptr, out_ptr, offsets_ptr,
    P, Q,
    sg_m, sg_p, sa_m, sa_q, so_e, so_p, so_q,
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, DOT_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    expert = tl.program_id(0)
    rp = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    rq = tl.program_id(2) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    start = tl.load(offsets_ptr + expert - 1, mask=expert > 0, other=0)
    end = tl.load(offsets_ptr + expert)
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        rows = r0 + tl.arange(0, BLOCK_K)
        g_t = tl.load(g_ptr + rows[None, :] * sg_m + rp[:, None] * sg_p, mask=(rows[None, :] < end) & (rp[:, None] < P), other=0.0)
        a = tl.load(a_ptr + rows[:, None] * sa_m + rq[None, :] * sa_q, mask=(rows[:, None] < end) & (rq[None, :] < Q), other=0.0)
        acc = dot(g_t, a, acc, DOT_MODE)
    mask = (rp[:, None] < P) & (rq[None, :] < Q)
    tl.store(out_ptr + expert * so_e + rp[:, None] * so_p + rq[None, :] * so_q, round_to_output(acc, OUT_DTYPE), mask=mask)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """a: [M, K] sorted by group; b: [E, K, N] (any strides); offsets: [E] int32 -> [M, N]."""
    rows, inner = a.shape
    n_experts, _, cols = b.shape
    out = torch.empty(rows, cols, dtype=a.dtype, device=a.device)
    if rows == 0 or cols == 0:
        return out
    grid = (triton.cdiv(rows, BLOCK_M) + n_experts, triton.cdiv(cols, BLOCK_N))
    with device_guard(a):
        _grouped_mm_kernel[grid](
            a, b, out, offsets,
            n_experts, cols, inner,
            *a.stride(), *b.stride(), *out.stride(),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_MODE=dot_mode(a.dtype), OUT_DTYPE=out_code(a.dtype),
            **launch_options(),
        )
    return out


def grouped_mm_weight(g: torch.Tensor, a: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """g: [M, P], a: [M, Q], rows sorted by group; offsets: [E] int32 -> [E, P, Q] (g_e^T a_e)."""
    rows, p_size = g.shape
    q_size = a.shape[1]
    n_experts = offsets.shape[0]
    out = torch.empty(n_experts, p_size, q_size, dtype=g.dtype, device=g.device)
    if out.numel() == 0:
        return out
    grid = (n_experts, triton.cdiv(p_size, BLOCK_M), triton.cdiv(q_size, BLOCK_N))
    with device_guard(g):
        _grouped_mm_weight_kernel[grid](
            g, a, out, offsets,
            p_size, q_size,
            *g.stride(), *a.stride(), *out.stride(),
            BLOCK_P=BLOCK_M, BLOCK_Q=BLOCK_N, BLOCK_K=BLOCK_K, DOT_MODE=dot_mode(g.dtype), OUT_DTYPE=out_code(g.dtype),
            **launch_options(),
        )
    return out
