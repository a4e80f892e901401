"""Gated linear attention (GLA): the step-by-step reference, one decode step, and the chunked form.

Public shapes ([batch, time, heads, dim], as every attention-like op in assay):
  q, k, g: [B, T, H, K]   g: log forget gate per key channel, <= 0 (e.g. logsigmoid(x) / 16)
  v:       [B, T, H, V]
  state:   [B, H, K, V]
Recurrence:  S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t ;   o_t = (q_t * scale) S_t,  scale = K**-0.5.

The state is accumulated in float32 (float64 for float64 inputs) whatever the input dtype: it sums
the whole history, and a bfloat16 state would lose the small late contributions. Outputs come back
in q's dtype; the final state stays in the accumulation dtype so that decode continues from it
without a rounding step.

`gla_chunk` is the plain-PyTorch port of the chunkwise-parallel kernel (no Triton): the sequence is
cut into chunks of C tokens; within a chunk, outputs are a masked [C, C] score matrix times v
(parallel over chunks); between chunks only a [K, V] state per head travels (a loop over chunks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assay.core.errors import AssayError

# Within a chunk, decays are applied relative to a point between query and key, so every exp()
# argument is <= 0 (no overflow whatever the gate). A sub-chunk is the unit that point moves by:
# inside one sub-chunk the [S, S, K] decay tensor is built explicitly (the "diagonal blocks").
SUB_CHUNK = 16
MIN_CHUNK = 16
MAX_CHUNK = 128


def _accumulation_dtype(*dtypes: torch.dtype) -> torch.dtype:
    result = torch.float32
    for dtype in dtypes:
        result = torch.promote_types(result, dtype)
    return result


def _check_inputs(q, k, v, g, initial_state) -> tuple[int, int, int, int, int]:
    if q.dim() != 4 or v.dim() != 4:
        raise AssayError(f"gla: q, k, g must be [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if k.shape != q.shape or g.shape != q.shape:
        raise AssayError(f"gla: q, k and g must have one shape; got q {tuple(q.shape)}, k {tuple(k.shape)}, g {tuple(g.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise AssayError(f"gla: v {tuple(v.shape)} must share batch, time and heads with q {tuple(q.shape)}")
    batch, time, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (batch, heads, key_dim, value_dim):
        raise AssayError(
            f"gla: initial_state must be [B, H, K, V] = {(batch, heads, key_dim, value_dim)}; got {tuple(initial_state.shape)}"
        )
    return batch, time, heads, key_dim, value_dim


def _check_chunk_size(chunk_size) -> None:
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, int)
        or not MIN_CHUNK <= chunk_size <= MAX_CHUNK
        or chunk_size % SUB_CHUNK
    ):
        raise AssayError(
            f"gla_chunk: chunk_size must be a multiple of {SUB_CHUNK} from {MIN_CHUNK} to {MAX_CHUNK} "
            f"(16, 32, 48, ..., 128); got {chunk_size!r}"
        )


def gla_step(q, k, v, g, state, scale=None):
    """One decode step: (o [B, H, V], new_state [B, H, K, V]) from q, k, g [B, H, K], v [B, H, V], state [B, H, K, V]."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = q.dtype
    accum = _accumulation_dtype(q.dtype, state.dtype)
    q, k, v, g = (x.to(accum) for x in (q, k, v, g))
    new_state = g.exp().unsqueeze(-1) * state.to(accum) + k.unsqueeze(-1) * v.unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q * scale, new_state)
    return o.to(out_dtype), new_state


def gla_recurrent(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """The reference: `gla_step` once per token. Returns (o [B, T, H, V] in q's dtype, final_state or None)."""
    batch, time, heads, key_dim, value_dim = _check_inputs(q, k, v, g, initial_state)
    accum = _accumulation_dtype(q.dtype)
    if initial_state is None:
        state = torch.zeros(batch, heads, key_dim, value_dim, dtype=accum, device=q.device)
    else:
        state = initial_state.to(accum)
    outputs = []
    for t in range(time):
        o_t, state = gla_step(q[:, t], k[:, t], v[:, t], g[:, t], state, scale)
        outputs.append(o_t)
    if outputs:
        o = torch.stack(outputs, dim=1)  # [B, T, H, V]
    else:
        o = q.new_zeros(batch, 0, heads, value_dim)
    return o.to(q.dtype), (state if output_final_state else None)


def gla_chunk(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunkwise-parallel GLA, equal to `gla_recurrent` within the ("recurrence", dtype) tolerance.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] or None.
    Inside, C = chunk_size, N = number of chunks, S = SUB_CHUNK, n = C // S sub-chunks per chunk:
      per-chunk tensors are [B, H, N, C, D], sub-chunk views [B, H, N, n, S, D].
    Returns (o [B, T, H, V] in q's dtype, final_state [B, H, K, V] in the accumulation dtype, or None).
    """
    _check_chunk_size(chunk_size)
    batch, time, heads, key_dim, value_dim = _check_inputs(q, k, v, g, initial_state)
    scale = key_dim**-0.5 if scale is None else scale
    accum = _accumulation_dtype(q.dtype)
    n_sub = chunk_size // SUB_CHUNK
    # Padding the end with k = v = q = 0 and g = 0 (no decay) leaves the state untouched through the
    # padded steps, so any T works and the final state is the one after token T.
    pad = (-time) % chunk_size
    n_chunks = (time + pad) // chunk_size

    def to_sub_chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, n, S, D]
        x = F.pad(x.to(accum).transpose(1, 2), (0, 0, 0, pad))
        return x.reshape(batch, heads, n_chunks, n_sub, SUB_CHUNK, x.shape[-1])

    q_s = to_sub_chunks(q) * scale
    k_s, v_s, g_s = to_sub_chunks(k), to_sub_chunks(v), to_sub_chunks(g)

    # Log decays, all <= 0, built from short sums so that nearby positions (whose decay matters)
    # never come from the difference of two long sums (which would cost float32 precision):
    within = g_s.cumsum(-2)  # from the sub-chunk's start through position i (inclusive)
    g_next = F.pad(g_s[..., 1:, :], (0, 0, 0, 1))
    after = g_next.flip(-2).cumsum(-2).flip(-2)  # from after position j to the sub-chunk's end
    sub_totals = within[..., -1, :]  # [B, H, N, n, K]: over each whole sub-chunk
    through_sub = sub_totals.cumsum(-2)  # chunk start through the end of sub-chunk J
    before_sub = F.pad(through_sub[..., :-1, :], (0, 0, 1, 0))  # chunk start up to sub-chunk I's start
    chunk_totals = through_sub[..., -1, :]  # [B, H, N, K]: over each whole chunk

    scores = _intra_chunk_scores(q_s, k_s, within, after, through_sub, before_sub)  # [B, H, N, C, C]
    v_c = v_s.flatten(-3, -2)  # [B, H, N, C, V]
    o_intra = scores @ v_c

    # Between chunks: each chunk's keys decayed to the chunk's end form its state update.
    to_chunk_end = after + (chunk_totals.unsqueeze(-2) - through_sub).unsqueeze(-2)  # [B, H, N, n, S, K]
    keys_to_end = (k_s * to_chunk_end.exp()).flatten(-3, -2)  # [B, H, N, C, K]
    chunk_updates = keys_to_end.transpose(-1, -2) @ v_c  # [B, H, N, K, V]
    chunk_decays = chunk_totals.exp().unsqueeze(-1)  # [B, H, N, K, 1]

    if initial_state is None:
        state = q_s.new_zeros(batch, heads, key_dim, value_dim)
    else:
        state = initial_state.to(accum)
    states_before = []
    for chunk in range(n_chunks):
        states_before.append(state)
        state = chunk_decays[:, :, chunk] * state + chunk_updates[:, :, chunk]
    states_before = torch.stack(states_before, dim=2)  # [B, H, N, K, V]: state entering each chunk

    queries_from_start = (q_s * (before_sub.unsqueeze(-2) + within).exp()).flatten(-3, -2)  # [B, H, N, C, K]
    o_inter = queries_from_start @ states_before  # [B, H, N, C, V]

    o = (o_intra + o_inter).reshape(batch, heads, n_chunks * chunk_size, value_dim)[:, :, :time]
    return o.transpose(1, 2).to(q.dtype), (state if output_final_state else None)


def _intra_chunk_scores(q_s, k_s, within, after, through_sub, before_sub):
    """scores[i, j] = sum_k q_ik k_jk exp(decay from after j through i) for j <= i, else 0.

    q_s, k_s, within, after: [B, H, N, n, S, K]; through_sub, before_sub: [B, H, N, n, K].
    Returns [B, H, N, C, C]. Every exp() argument is <= 0: masked entries are set to -inf before it.
    """
    *lead, n_sub, sub, key_dim = q_s.shape
    device = q_s.device
    chunk = n_sub * sub

    # Diagonal blocks (query and key in one sub-chunk): the explicit [S, S, K] decay, in float32.
    causal = torch.ones(sub, sub, dtype=torch.bool, device=device).tril()  # [S(i), S(j)]
    diag_log_decay = (within.unsqueeze(-2) - within.unsqueeze(-3)).masked_fill(~causal.unsqueeze(-1), float("-inf"))
    diag_scores = (q_s.unsqueeze(-2) * k_s.unsqueeze(-3) * diag_log_decay.exp()).sum(-1)  # [..., n, S, S]

    # Off-diagonal blocks (key in an earlier sub-chunk J < I): decays meet at the start of the query's
    # sub-chunk I; the query carries the decay after it, each key the decay up to it.
    queries_rel = q_s * within.exp()  # [..., n(I), S, K]
    between = before_sub.unsqueeze(-2) - through_sub.unsqueeze(-3)  # [..., n(I), n(J), K]: sub-chunks strictly between
    earlier = torch.ones(n_sub, n_sub, dtype=torch.bool, device=device).tril(-1)  # [n(I), n(J)]: J < I
    key_log_decay = (after.unsqueeze(-4) + between.unsqueeze(-2)).masked_fill(
        ~earlier[:, :, None, None], float("-inf")
    )  # [..., n(I), n(J), S, K]
    keys_rel = (k_s.unsqueeze(-4) * key_log_decay.exp()).flatten(-3, -2)  # [..., n(I), C, K]
    off_scores = queries_rel @ keys_rel.transpose(-1, -2)  # [..., n(I), S, C]

    # Place the diagonal blocks at (I, I) of the [n, S, n, S] grid.
    block_eye = torch.eye(n_sub, dtype=q_s.dtype, device=device)[:, None, :, None]  # [n, 1, n, 1]
    diag_grid = diag_scores.unsqueeze(-2) * block_eye  # [..., n, S, n, S]
    return off_scores.reshape(*lead, chunk, chunk) + diag_grid.reshape(*lead, chunk, chunk)
