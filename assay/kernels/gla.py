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
# gla_chunk works through the sequence this many tokens (rounded down to whole chunks) at a time.
SEGMENT_TOKENS = 2048


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
    o = ((q * scale).unsqueeze(-1) * new_state).sum(-2)  # [B, H, V]; a tiny bmm costs more than this on CPU
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
    # unbind: the backward of one unbind is one stack; indexing q[:, t] per step would be quadratic in T.
    for q_t, k_t, v_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), g.unbind(1)):
        o_t, state = gla_step(q_t, k_t, v_t, g_t, state, scale)
        outputs.append(o_t)
    if outputs:
        o = torch.stack(outputs, dim=1)  # [B, T, H, V]
    else:
        o = q.new_zeros(batch, 0, heads, value_dim)
    return o.to(q.dtype), (state if output_final_state else None)


def gla_chunk(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunkwise-parallel GLA, equal to `gla_recurrent` within the ("recurrence", dtype) tolerance.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] or None.
    Returns (o [B, T, H, V] in q's dtype, final_state [B, H, K, V] in the accumulation dtype, or None).
    chunk_size: a multiple of 16 from 16 to 128 (AssayError otherwise); T need not be a multiple of it.
    """
    _check_chunk_size(chunk_size)
    batch, time, heads, key_dim, value_dim = _check_inputs(q, k, v, g, initial_state)
    scale = key_dim**-0.5 if scale is None else scale
    accum = _accumulation_dtype(q.dtype)
    if initial_state is None:
        state = torch.zeros(batch, heads, key_dim, value_dim, dtype=accum, device=q.device)
    else:
        state = initial_state.to(accum)
    # Segments of whole chunks, the state carried between them: the intermediates of one segment stay
    # in cache, which made 16K tokens 2.3x faster on this project's 2-core CPU than one pass over all of them.
    segment = chunk_size * max(1, SEGMENT_TOKENS // chunk_size)
    # split, not slicing: split's backward is one cat, each slice's would fill a whole-input zero tensor.
    outputs = []
    segments = zip(*(x.split(segment, dim=1) for x in (q, k, v, g))) if time else ()
    for q_seg, k_seg, v_seg, g_seg in segments:
        o_segment, state = _chunk_segment(q_seg, k_seg, v_seg, g_seg, state, scale, chunk_size)
        outputs.append(o_segment)
    o = torch.cat(outputs, dim=1) if outputs else q.new_zeros(batch, 0, heads, value_dim)
    return o.to(q.dtype), (state if output_final_state else None)


def _chunk_segment(q, k, v, g, state, scale, chunk_size):
    """One segment: (o [B, T, H, V] in the accumulation dtype, state after it [B, H, K, V]).

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; state: [B, H, K, V] in the accumulation dtype.
    Inside, C = chunk_size, N = number of chunks, S = SUB_CHUNK, n = C // S sub-chunks per chunk:
      per-chunk tensors are [B, H, N, C, D], sub-chunk views [B, H, N, n, S, D].
    """
    batch, time, heads, _ = q.shape
    value_dim = v.shape[-1]
    n_sub = chunk_size // SUB_CHUNK
    # Padding the end with k = v = q = 0 and g = 0 (no decay) leaves the state untouched through the
    # padded steps, so any T works and the final state is the one after token T.
    pad = (-time) % chunk_size
    n_chunks = (time + pad) // chunk_size

    def to_sub_chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, n, S, D]
        x = F.pad(x.to(state.dtype).transpose(1, 2), (0, 0, 0, pad))
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

    # unbind, not indexing in the loop: the backward of one unbind is one stack, while each indexed
    # slice's backward would write a zero tensor the size of the whole input (quadratic in N).
    states_before = []
    for chunk_decay, chunk_update in zip(chunk_decays.unbind(2), chunk_updates.unbind(2)):
        states_before.append(state)
        state = chunk_decay * state + chunk_update
    states_before = torch.stack(states_before, dim=2)  # [B, H, N, K, V]: state entering each chunk

    queries_from_start = (q_s * (before_sub.unsqueeze(-2) + within).exp()).flatten(-3, -2)  # [B, H, N, C, K]
    o_inter = queries_from_start @ states_before  # [B, H, N, C, V]

    o = (o_intra + o_inter).reshape(batch, heads, n_chunks * chunk_size, value_dim)[:, :, :time]
    return o.transpose(1, 2), state


def _intra_chunk_scores(q_s, k_s, within, after, through_sub, before_sub):
    """scores[i, j] = sum_k q_ik k_jk exp(decay from after j through i) for j <= i, else 0.

    q_s, k_s, within, after: [B, H, N, n, S, K]; through_sub, before_sub: [B, H, N, n, K].
    Returns [B, H, N, C, C]. Every exp() argument is <= 0, and the entries above the diagonal
    (j > i) are never computed: the loops below visit only the lower triangle, which halves the
    elementwise work that dominates this function on CPU.
    """
    *lead, n_sub, sub, key_dim = q_s.shape
    chunk = n_sub * sub

    # Diagonal blocks (query and key in one sub-chunk), one key position j at a time, rows i >= j:
    # the explicit per-channel decay exp(within_i - within_j), in float32.
    diag_columns = []
    for j in range(sub):
        log_decay = within[..., j:, :] - within[..., j : j + 1, :]  # [..., n, S - j, K]
        column = (q_s[..., j:, :] * k_s[..., j : j + 1, :] * log_decay.exp()).sum(-1)  # [..., n, S - j]
        diag_columns.append(F.pad(column, (j, 0)))
    diag_scores = torch.stack(diag_columns, dim=-1)  # [..., n, S(i), S(j)]

    # Off-diagonal blocks (key in an earlier sub-chunk J < I): decays meet at the start of the query's
    # sub-chunk I; the query carries the decay after that point, each key the decay up to it.
    queries_rel = q_s * within.exp()  # [..., n, S, K]
    score_rows = []
    for block in range(n_sub):
        row_parts = []
        if block:
            between = (before_sub[..., block : block + 1, :] - through_sub[..., :block, :]).unsqueeze(-2)  # [..., I, 1, K]
            keys_rel = (k_s[..., :block, :, :] * (after[..., :block, :, :] + between).exp()).flatten(-3, -2)  # [..., I*S, K]
            row_parts.append(queries_rel[..., block, :, :] @ keys_rel.transpose(-1, -2))  # [..., S, I*S]
        row_parts.append(diag_scores[..., block, :, :])
        row = torch.cat(row_parts, dim=-1)  # [..., S, (I+1)*S]
        score_rows.append(F.pad(row, (0, chunk - (block + 1) * sub)))
    return torch.cat(score_rows, dim=-2)
