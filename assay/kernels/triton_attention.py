"""Causal attention in Triton (FlashAttention-2 schedule), kernel layout [batch, heads, seq, head_dim].

Forward: one program per (BLOCK_M queries, batch x head) walks the keys up to its last query with an
online softmax and writes the output and the row log-sum-exp (natural log, as PyTorch's CPU flash
kernel returns it). Backward recomputes the probabilities from the saved log-sum-exp: one kernel
accumulates dK and dV per key block (over every query head of the key/value head: grouped-query
attention), one accumulates dQ per query block. Any sequence length and head_dim <= 256 (masked
tiles; head_dim is padded to a power of two in registers). float32 accumulation; float32 inputs
multiply in full precision (triton_common.dot_mode).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from assay.kernels.triton_common import device_guard, dot, dot_mode, launch_options, out_code, round_to_output

BLOCK_M, BLOCK_N = 32, 32
LOG2E = 1.4426950408889634


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, so_b, so_h, so_t, so_d, sl_b, sl_h, sl_t,
    heads, group, seq_len, head_dim, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    kv_head = head // group
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < head_dim
    q = tl.load(q_ptr + batch * sq_b + head * sq_h + rm[:, None] * sq_t + rd[None, :] * sq_d, mask=(rm[:, None] < seq_len) & d_ok[None, :], other=0.0)
    k_base = k_ptr + batch * sk_b + kv_head * sk_h
    v_base = v_ptr + batch * sv_b + kv_head * sv_h
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 below
    end_n = tl.minimum(start_m + BLOCK_M, seq_len)
    for start_n in range(0, end_n, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        n_ok = rn < seq_len
        k_t = tl.load(k_base + rn[None, :] * sk_t + rd[:, None] * sk_d, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        scores = dot(q, k_t, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_MODE) * qk_scale
        scores = tl.where((rn[None, :] <= rm[:, None]) & n_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + rn[:, None] * sv_t + rd[None, :] * sv_d, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = dot(round_to_output(p, OUT_DTYPE), v, acc * alpha[:, None], DOT_MODE)
        m_i = m_new
    out = acc / l_i[:, None]
    m_ok = rm < seq_len
    tl.store(o_ptr + batch * so_b + head * so_h + rm[:, None] * so_t + rd[None, :] * so_d, round_to_output(out, OUT_DTYPE), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + batch * sl_b + head * sl_h + rm * sl_t, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=m_ok)


@triton.jit
def _attention_bwd_preprocess(
    o_ptr, do_ptr, delta_ptr,
    so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d,
    heads, seq_len, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    rd = tl.arange(0, BLOCK_D)
    mask = (rm[:, None] < seq_len) & (rd[None, :] < head_dim)
    o = tl.load(o_ptr + batch * so_b + head * so_h + rm[:, None] * so_t + rd[None, :] * so_d, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + batch * sdo_b + head * sdo_h + rm[:, None] * sdo_t + rd[None, :] * sdo_d, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + tl.program_id(1) * seq_len + rm, tl.sum(o * do, 1), mask=rm < seq_len)


@triton.jit
def _attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d, sl_b, sl_h, sl_t,
    sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d,
    heads, kv_heads, group, seq_len, head_dim, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    batch = tl.program_id(1) // kv_heads
    kv_head = tl.program_id(1) % kv_heads
    rn = start_n + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    n_ok = rn < seq_len
    d_ok = rd < head_dim
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + batch * sk_b + kv_head * sk_h + rn[:, None] * sk_t + rd[None, :] * sk_d, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + batch * sv_b + kv_head * sv_h + rn[:, None] * sv_t + rd[None, :] * sv_d, mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for head in range(kv_head * group, kv_head * group + group):
        q_base = q_ptr + batch * sq_b + head * sq_h
        do_base = do_ptr + batch * sdo_b + head * sdo_h
        row = (batch * heads + head) * seq_len
        # Causal: only queries at or after this key block see it.
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, seq_len, BLOCK_M):
            rm = start_m + tl.arange(0, BLOCK_M)
            m_ok = rm < seq_len
            q_t = tl.load(q_base + rm[None, :] * sq_t + rd[:, None] * sq_d, mask=m_ok[None, :] & d_ok[:, None], other=0.0)
            do = tl.load(do_base + rm[:, None] * sdo_t + rd[None, :] * sdo_d, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            do_t = tl.load(do_base + rm[None, :] * sdo_t + rd[:, None] * sdo_d, mask=m_ok[None, :] & d_ok[:, None], other=0.0)
            lse = tl.load(lse_ptr + batch * sl_b + head * sl_h + rm * sl_t, mask=m_ok, other=0.0)
            delta = tl.load(delta_ptr + row + rm, mask=m_ok, other=0.0)
            scores_t = dot(k, q_t, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), DOT_MODE) * scale  # [keys, queries]
            visible = (rm[None, :] >= rn[:, None]) & m_ok[None, :] & n_ok[:, None]
            p_t = tl.where(visible, tl.exp(scores_t - lse[None, :]), 0.0)
            dv = dot(round_to_output(p_t, OUT_DTYPE), do, dv, DOT_MODE)
            dp_t = dot(v, do_t, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), DOT_MODE)
            ds_t = p_t * (dp_t - delta[None, :])
            q = tl.trans(q_t)
            dk = dot(round_to_output(ds_t, OUT_DTYPE), q, dk, DOT_MODE)
    dk = dk * scale
    tl.store(dk_ptr + batch * sdk_b + kv_head * sdk_h + rn[:, None] * sdk_t + rd[None, :] * sdk_d, round_to_output(dk, OUT_DTYPE), mask=kv_mask)
    tl.store(dv_ptr + batch * sdv_b + kv_head * sdv_h + rn[:, None] * sdv_t + rd[None, :] * sdv_d, round_to_output(dv, OUT_DTYPE), mask=kv_mask)


@triton.jit
def _attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d, sl_b, sl_h, sl_t,
    sdq_b, sdq_h, sdq_t, sdq_d,
    heads, group, seq_len, head_dim, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    kv_head = head // group
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    m_ok = rm < seq_len
    d_ok = rd < head_dim
    q_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + batch * sq_b + head * sq_h + rm[:, None] * sq_t + rd[None, :] * sq_d, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + batch * sdo_b + head * sdo_h + rm[:, None] * sdo_t + rd[None, :] * sdo_d, mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + batch * sl_b + head * sl_h + rm * sl_t, mask=m_ok, other=0.0)
    delta = tl.load(delta_ptr + (batch * heads + head) * seq_len + rm, mask=m_ok, other=0.0)
    k_base = k_ptr + batch * sk_b + kv_head * sk_h
    v_base = v_ptr + batch * sv_b + kv_head * sv_h
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    end_n = tl.minimum(start_m + BLOCK_M, seq_len)
    for start_n in range(0, end_n, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        n_ok = rn < seq_len
        k_t = tl.load(k_base + rn[None, :] * sk_t + rd[:, None] * sk_d, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        v_t = tl.load(v_base + rn[None, :] * sv_t + rd[:, None] * sv_d, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        scores = dot(q, k_t, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_MODE) * scale
        visible = (rn[None, :] <= rm[:, None]) & n_ok[None, :] & m_ok[:, None]
        p = tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)
        dp = dot(do, v_t, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_MODE)
        ds = p * (dp - delta[:, None])
        dq = dot(round_to_output(ds, OUT_DTYPE), tl.trans(k_t), dq, DOT_MODE)
    dq = dq * scale
    tl.store(dq_ptr + batch * sdq_b + head * sdq_h + rm[:, None] * sdq_t + rd[None, :] * sdq_d, round_to_output(dq, OUT_DTYPE), mask=q_mask)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """q: [B, H, T, D]; k, v: [B, Hkv, T, D]; writes `out` (like q) and returns lse [B, H, T] float32."""
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    lse = torch.empty(batch, heads, seq_len, dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return lse
    grid = (triton.cdiv(seq_len, BLOCK_M), batch * heads)
    with device_guard(q):
        _attention_fwd_kernel[grid](
            q, k, v, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
            heads, heads // kv_heads, seq_len, head_dim, 1.0 / math.sqrt(head_dim),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=_block_d(head_dim), DOT_MODE=dot_mode(q.dtype), OUT_DTYPE=out_code(q.dtype),
            **launch_options(),
        )
    return lse


def attention_backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v) -> None:
    """Writes grad_q (like q), grad_k, grad_v (like k, v) from what forward saved (out, lse)."""
    with device_guard(q):
        _attention_backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v)


def _attention_backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v) -> None:
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    if q.numel() == 0:
        grad_q.zero_(), grad_k.zero_(), grad_v.zero_()
        return
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    block_d = _block_d(head_dim)
    delta = torch.empty(batch, heads, seq_len, dtype=torch.float32, device=q.device)
    _attention_bwd_preprocess[(triton.cdiv(seq_len, BLOCK_M), batch * heads)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), heads, seq_len, head_dim, BLOCK_M=BLOCK_M, BLOCK_D=block_d,
    )
    common = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, DOT_MODE=dot_mode(q.dtype), OUT_DTYPE=out_code(q.dtype))
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *lse.stride())
    _attention_bwd_dkdv_kernel[(triton.cdiv(seq_len, BLOCK_N), batch * kv_heads)](
        q, k, v, grad_out, lse, delta, grad_k, grad_v,
        *strides, *grad_k.stride(), *grad_v.stride(),
        heads, kv_heads, group, seq_len, head_dim, scale, **common, **launch_options(),
    )
    _attention_bwd_dq_kernel[(triton.cdiv(seq_len, BLOCK_M), batch * heads)](
        q, k, v, grad_out, lse, delta, grad_q,
        *strides, *grad_q.stride(),
        heads, group, seq_len, head_dim, scale, **common, **launch_options(),
    )
