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
Its forward and backward are written out (`_GLAChunkFunction`): the backward recomputes the per-chunk
tensors from q, k, v, g and the chunk-entry states, so autograd keeps O(T*K) per head, not O(T*C*K).

Two forms of the [C, C] scores, chosen per (batch, head, chunk) from the gates' range (docs/gla.md):
- factorised (one matmul): scores = (q exp(b)) (k exp(-b))^T with b the cumulative log gate inside
  the chunk; exact while the chunk's total log decay B is >= -FACTORISED_LOG_RANGE in every channel
  (no factor above e^RANGE |k|). The eager forward builds k exp(-b) directly, in the fewest full-size
  passes (`_eager_forward`); the backward and the compiled forward (where inductor fuses the
  passes) use (k exp(B - b)) exp(-B), each factor safe for any gate (`_chunk_parts`);
- explicit (gates that wipe the state inside one chunk): the [C, C, K] decays exp(b_i - b_j) built
  from a float64 cumulative sum, only for the chunks that need it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from assay.core.errors import AssayError

MIN_CHUNK = 16
MAX_CHUNK = 128
CHUNK_MULTIPLE = 16
# The factorised form's factors reach exp(|B|/2) and the discarded upper triangle exp(|B|): at 60,
# e^30 and e^60 = 1e26, far from float32's 3e38 even times K |q| |k|, and exp(b) >= e^-60 stays a
# normal float32 (no denormals, whose arithmetic is slow and inexact).
FACTORISED_LOG_RANGE = 60.0
# gla_chunk works through the sequence this many tokens (rounded down to whole chunks) at a time:
# one segment's [T, H, K] intermediates (2 MB at H=4, K=64 in float32) stay near this CPU's 2 MB L2
# per core, and only one [K, V] state crosses a segment boundary; each segment costs about 0.4 ms of
# fixed op overhead. At 4K tokens on 2 threads 2048 was faster than 1024 and than one segment.
SEGMENT_TOKENS = 2048
# The explicit form's [chunks, C, C, K] decay tensor is built this many elements at a time (memory).
EXPLICIT_BLOCK_ELEMENTS = 1 << 22
# The eager cumulative gate sums rows this many positions apart at once (`_cumulative_gates`); a
# divisor of CHUNK_MULTIPLE.
CUMSUM_BLOCK = 8


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
        or chunk_size % CHUNK_MULTIPLE
    ):
        raise AssayError(
            f"gla_chunk: chunk_size must be a multiple of {CHUNK_MULTIPLE} from {MIN_CHUNK} to {MAX_CHUNK} "
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
    scale = key_dim**-0.5 if scale is None else float(scale)
    accum = _accumulation_dtype(q.dtype)
    if initial_state is None:
        state = torch.zeros(batch, heads, key_dim, value_dim, dtype=accum, device=q.device)
    else:
        state = initial_state.to(accum)
    segment = chunk_size * max(1, SEGMENT_TOKENS // chunk_size)
    # split, not slicing: split's backward is one cat, each slice's would fill a whole-input zero tensor.
    outputs = []
    segments = zip(*(x.split(segment, dim=1) for x in (q, k, v, g))) if time else ()
    for q_seg, k_seg, v_seg, g_seg in segments:
        o_segment, state = _segment(q_seg, k_seg, v_seg, g_seg, state, scale, chunk_size)
        outputs.append(o_segment)
    if not outputs:
        o = q.new_zeros(batch, 0, heads, value_dim)
    else:
        o = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return o.to(q.dtype), (state if output_final_state else None)


def _segment(q, k, v, g, state, scale, chunk_size):
    """[B, T, H, D] inputs -> (o [B, T, H, V] in the accumulation dtype, state after them)."""
    time = q.shape[1]
    pad = (-time) % chunk_size

    # Padding the end with k = v = q = 0 and g = 0 (no decay) leaves the state untouched through the
    # padded steps, so any T works and the final state is the one after token T. The layout change
    # to [B, H, T, D] happens inside the Function, fused into its first elementwise ops.
    def whole_chunks(x: torch.Tensor) -> torch.Tensor:
        x = x.to(state.dtype)
        return F.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x

    inputs = (*map(whole_chunks, (q, k, v, g)), state)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs) or _compiling():
        o, state, _ = _GLAChunkFunction.apply(*inputs, scale, chunk_size)
    else:  # nothing to differentiate (inference, prefill): the Function's bookkeeping costs 60 us a call
        o, state, _ = _GLAChunkFunction.forward(*inputs, scale, chunk_size)
    return (o[:, :time] if pad else o), state


class _GLAChunkFunction(torch.autograd.Function):
    """GLA over whole chunks: q, k, g [B, T, H, K], v [B, T, H, V] (T a multiple of C), state [B, H, K, V].

    Returns (o [B, T, H, V], final state, the [B, H, N, K, V] states entering each chunk); saves only
    its inputs and those states: the backward recomputes decays and scores from them (a few
    elementwise passes and one matmul more than keeping them, and no O(T * C) tensor alive between
    forward and backward). setup_context form, so that torch.func (gla_op's VJP) can run it too.
    """

    @staticmethod
    def forward(q, k, v, g, initial_state, scale, chunk_size):
        if not _compiling():
            return _eager_forward(q, k, v, g, initial_state, scale, chunk_size)
        # Compiled, the backward's parts: inductor fuses the elementwise passes that the eager form
        # saves, and the data-dependent branch (a cond) then only replaces scores.
        v_c = _chunked(v, chunk_size).contiguous()  # [B, H, N, C, V]
        parts = _chunk_parts(q, k, g, chunk_size)
        scores = _scores(parts, scale)
        updates = _bmm(parts.keys_out.transpose(-1, -2), v_c)  # [B, H, N, K, V]: each chunk's keys at its end
        states, final = _scan_states(initial_state, parts.chunk_decay, updates)  # [B, H, N, K, V], [B, H, K, V]
        # o = scores v + scale * (q exp(b)) S_entry, the second added inside the batched matmul.
        o = _bmm(parts.queries_in, states, add=_bmm(scores, v_c), alpha=scale)
        return o.flatten(2, 3).transpose(1, 2), final, states

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, g, _, scale, chunk_size = inputs
        _, final, states = output
        ctx.save_for_backward(q, k, v, g, states, final)
        ctx.mark_non_differentiable(states)
        # Unused outputs (always the states) reach backward as None, not as zero tensors filled for nothing.
        ctx.set_materialize_grads(False)
        ctx.scale, ctx.chunk_size = scale, chunk_size

    @staticmethod
    def backward(ctx, grad_o, grad_final, _):
        q, k, v, g, states_before, final = ctx.saved_tensors
        scale, chunk_size = ctx.scale, ctx.chunk_size
        parts = _chunk_parts(q, k, g, chunk_size)
        scores = _scores(parts, scale)
        v_c = _chunked(v, chunk_size).contiguous()
        if grad_o is None:
            grad_o = torch.zeros_like(v)
        do = _chunked(grad_o, chunk_size).contiguous()  # [B, H, N, C, V]
        if grad_final is None:
            grad_final = torch.zeros_like(final)

        # State gradients, last chunk first: dS_n = exp(B_n) dS_{n+1} + scale (q exp(b))_n^T do_n.
        from_outputs = _bmm(parts.queries_in.transpose(-1, -2), do, alpha=scale)  # [B, H, N, K, V]
        grad_after, grad_state = _reverse_scan(grad_final, parts.chunk_decay, from_outputs)  # [B, H, N, K, V]: of each exit state

        grad_scores = _bmm(do, v_c.transpose(-1, -2)).tril_()  # [B, H, N, C, C]
        grad_v = _bmm(parts.keys_out, grad_after, add=_bmm(scores.transpose(-1, -2), do))
        # q and k: the part through the states plus the factorised intra-chunk part (zero in explicit
        # chunks, whose rescale is 0), in decayed units, then times the decays.
        grad_q = _bmm(grad_scores, parts.keys_out * parts.rescale_sq, add=_bmm(do, states_before.transpose(-1, -2)), alpha=scale, beta=scale)
        grad_q.mul_(parts.decay_in)
        grad_k = _bmm(grad_scores.transpose(-1, -2), parts.queries_in * parts.rescale_sq, add=_bmm(v_c, grad_after.transpose(-1, -2)), alpha=scale)
        grad_k.mul_(parts.decay_out)
        _add_explicit_grads(grad_q, grad_k, parts, grad_scores, scale)

        # g: scores depend on b_i - b_j only, so db = q dq - k dk; the chunk total B also scales the
        # exit state (exp(B) S_entry + keys_out^T v, both linear in exp(B) per key channel's row).
        grad_b = torch.mul(grad_q, parts.q_c).addcmul_(grad_k, parts.k_c, value=-1.0)
        # The state after chunk n is the one entering n + 1 (the final state after the last): no cat.
        exit_terms = grad_b[..., -1, :]  # [B, H, N, K]
        exit_terms[:, :, :-1] += (grad_after[:, :, :-1] * states_before[:, :, 1:]).sum(-1)
        exit_terms[:, :, -1] += (grad_after[:, :, -1] * final).sum(-1)
        grad_g = _reverse_cumsum_(grad_b)  # b_i sums g_t for t <= i

        def back(x):  # [B, H, N, C, D] -> [B, T, H, D] (a view)
            return x.flatten(2, 3).transpose(1, 2)

        return back(grad_q), back(grad_k), back(grad_v), back(grad_g), grad_state, None, None


class _ChunkParts:
    """Per-chunk tensors the forward and the backward both build. [B, H, N, C, K] unless noted."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)


def _chunked(x: torch.Tensor, chunk_size: int) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, C, D] (a view)
    return x.transpose(1, 2).unflatten(2, (x.shape[1] // chunk_size, chunk_size))


def _bmm(a, b, add=None, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """alpha a @ b (+ beta add) over [B, H, N] batch dims as one batched matmul: bmm takes transposed
    operands as they are, where a 5-D matmul would copy them. `add` (a contiguous temporary, as every
    caller passes) is accumulated into in place: an out-of-place baddbmm would first copy it."""
    a3, b3 = a.flatten(0, -3), b.flatten(0, -3)
    if add is None:
        out = torch.bmm(a3, b3) if alpha == 1.0 else torch.baddbmm(a3.new_empty(()), a3, b3, beta=0.0, alpha=alpha)
    else:
        out = add.flatten(0, -3).baddbmm_(a3, b3, beta=beta, alpha=alpha)
    return out.view(*a.shape[:-1], b.shape[-1])


def _chunk_parts(q, k, g, chunk_size) -> _ChunkParts:
    """Decays and decayed q, k, from [B, T, H, K] inputs; the first op on each also makes [B, H, N, C, K]."""
    q_c, k_c, g_c = (_chunked(x, chunk_size) for x in (q, k, g))
    b = _cumulative_gates(g, chunk_size)  # log decay from the chunk's start through position i, <= 0
    total = b[..., -1:, :]  # [B, H, N, 1, K]: over the whole chunk
    decay_in = b.exp()  # <= 1
    decay_out = torch.sub(total, b).exp_()  # from after position j to the chunk's end, <= 1
    factorised = total.amin(-1, keepdim=True) >= -FACTORISED_LOG_RANGE  # [B, H, N, 1, 1]
    # (q exp(b)) (k exp(B - b) exp(-B))^T = q k^T exp(b_i - b_j): the second factor is at most
    # exp(RANGE) |k| in a factorised chunk; 0 in an explicit chunk (its scores are replaced).
    rescale_sq = torch.where(factorised, (-total).clamp(max=FACTORISED_LOG_RANGE).exp(), 0.0)
    return _ChunkParts(
        q_c=q_c, k_c=k_c, g_c=g_c, decay_in=decay_in, decay_out=decay_out, rescale_sq=rescale_sq,
        queries_in=torch.mul(decay_in, q_c), keys_out=torch.mul(decay_out, k_c),  # contiguous, as decay_*
        explicit=~factorised[..., 0, 0], chunk_decay=total.exp().transpose(-1, -2),  # [B, H, N, K, 1]
    )


def _scores(parts: _ChunkParts, scale: float) -> torch.Tensor:
    """[B, H, N, C, C]: scale q_i . k_j exp(b_i - b_j) for j <= i, 0 above the diagonal."""
    scores = _bmm(parts.queries_in, (parts.keys_out * parts.rescale_sq).transpose(-1, -2), alpha=scale).tril_()
    return _replace_explicit(
        parts.explicit, (scores,), lambda q_e, k_e, g_e: (_explicit_scores(q_e, k_e, g_e, scale),), (parts.q_c, parts.k_c, parts.g_c)
    )[0]


def _scan_states(state, chunk_decay, updates):
    """S_{n+1} = exp(B_n) S_n + U_n from [B, H, K, V], [B, H, N, K, 1], [B, H, N, K, V]:
    (the states entering each chunk [B, H, N, K, V], the state after the last). Eager, each entry
    state is written in place into one tensor (no list to stack); compiled, a list and one stack."""
    decays, updates = chunk_decay.unbind(2), updates.unbind(2)  # unbind: one op to split
    if _compiling():
        states = []
        for decay, update in zip(decays, updates):
            states.append(state)
            state = torch.addcmul(update, decay, state)
        return torch.stack(states, dim=2), state
    states = torch.empty(*state.shape[:2], len(updates), *state.shape[2:], dtype=updates[0].dtype, device=state.device)
    entry = states.unbind(2)
    entry[0].copy_(state)
    for decay, update, before, after in zip(decays, updates, entry, entry[1:]):
        torch.addcmul(update, decay, before, out=after)
    return states, torch.addcmul(updates[-1], decays[-1], entry[-1])


def _reverse_scan(grad_final, chunk_decay, from_outputs):
    """The state gradients, last chunk first: dS_n = exp(B_n) dS_{n+1} + from_outputs_n, from
    [B, H, K, V], [B, H, N, K, 1], [B, H, N, K, V]: (the gradient of each chunk's exit state
    [B, H, N, K, V], that of the initial state). Eager, written in place (no list to stack)."""
    decays, terms = chunk_decay.unbind(2), from_outputs.unbind(2)
    if _compiling():
        grad_after, grad_state = [], grad_final
        for decay, term in zip(reversed(decays), reversed(terms)):
            grad_after.append(grad_state)
            grad_state = torch.addcmul(term, decay, grad_state)
        return torch.stack(grad_after[::-1], dim=2), grad_state
    grad_after = torch.empty_like(from_outputs)
    after = grad_after.unbind(2)
    after[-1].copy_(grad_final)
    for decay, term, later, earlier in zip(decays[:0:-1], terms[:0:-1], after[:0:-1], after[-2::-1]):
        torch.addcmul(term, decay, later, out=earlier)
    return grad_after, torch.addcmul(terms[0], decays[0], after[0])


def _eager_forward(q, k, v, g, state, scale: float, chunk_size: int):
    """The forward without a compiler, in the fewest full-size passes: (o [B, T, H, V], final state,
    the [B, H, N, K, V] states entering each chunk), from [B, T, H, D] inputs (T a multiple of C).

    One decay factor per position, exp(b); queries q exp(b), keys k exp(-b) (at most e^RANGE |k| in
    a factorised chunk); each chunk's update (k exp(-b))^T v scaled by exp(B) after the matmul ([K, V]
    rows, not [C, K] keys); explicit chunks get scores and updates in their own form."""
    q_c, k_c, v_c = (_chunked(x, chunk_size) for x in (q, k, v))
    decay_in = _cumulative_gates(g, chunk_size).exp_()  # [B, H, N, C, K]: exp(b), contiguous
    chunk_decay = decay_in[..., -1, :].unsqueeze(-1).clone()  # [B, H, N, K, 1]: exp(B)
    queries_in = torch.mul(decay_in, q_c)  # decay first: the result takes its contiguous layout
    explicit = chunk_decay.amin((-2, -1)) < math.exp(-FACTORISED_LOG_RANGE)  # [B, H, N]: B < -RANGE somewhere
    if explicit.any():
        # exp(-b) overflows only in explicit chunks, whose values are replaced below: the floor keeps
        # them finite (no inf * 0 = nan in a matmul, no slow denormals) and leaves factorised ones alone.
        decay_in.clamp_(min=math.exp(-FACTORISED_LOG_RANGE))
    keys_in = torch.div(k_c, decay_in, out=decay_in)  # k exp(-b), in exp(b)'s memory
    v_c = v_c.contiguous()  # [B, H, N, C, V]
    scores = _bmm(queries_in, keys_in.transpose(-1, -2), alpha=scale).tril_()
    updates = _bmm(keys_in.transpose(-1, -2), v_c).mul_(chunk_decay)  # (k exp(B - b))^T v
    scores, updates = _replace_explicit(
        explicit, (scores, updates),
        lambda q_e, k_e, v_e, g_e: (_explicit_scores(q_e, k_e, g_e, scale), _explicit_updates(k_e, v_e, g_e)),
        (q_c, k_c, v_c, _chunked(g, chunk_size)),
    )
    states, final = _scan_states(state, chunk_decay, updates)  # [B, H, N, K, V], [B, H, K, V]
    # o = scores v + scale (q exp(b)) S_entry: the second added in place by the same batched matmul.
    o = _bmm(scores, v_c)
    o.flatten(0, 2).baddbmm_(queries_in.flatten(0, 2), states.flatten(0, 2), alpha=scale)
    return o.flatten(2, 3).transpose(1, 2), final, states


def _cumulative_gates(g, chunk_size: int) -> torch.Tensor:
    """b [B, H, N, C, K] (contiguous) from g [B, T, H, K]: the log gate summed from each chunk's start.

    Eager, in blocks of CUMSUM_BLOCK positions: position by position inside every block at once
    (CUMSUM_BLOCK - 1 adds of [B, H, N, C / CUMSUM_BLOCK, K] rows, each reading g where it is), then
    each block plus the last row of the one before (C / CUMSUM_BLOCK - 1 adds). torch.cumsum over a
    strided dim of length C runs a scalar loop per element (with the exp, 0.68-0.73 ms per 2,048-token
    segment against 0.62 ms for these adds; docs/gla.md); and unlike a loop over C single rows, every
    add here is large enough (64K elements at 2,048 tokens, H=4, K=64) for PyTorch to split over
    threads. Compiled, one cumsum (the loops would unroll into nodes)."""
    g_c = _chunked(g, chunk_size)
    if _compiling():
        return g_c.cumsum(-2)
    blocked = g_c.unflatten(-2, (chunk_size // CUMSUM_BLOCK, CUMSUM_BLOCK))  # [B, H, N, blocks, rows, K]
    b = torch.empty(blocked.shape, dtype=g.dtype, device=g.device)
    rows, g_rows = b.unbind(-2), blocked.unbind(-2)
    rows[0].copy_(g_rows[0])
    for previous, row, g_row in zip(rows, rows[1:], g_rows[1:]):
        torch.add(previous, g_row, out=row)
    blocks = b.unbind(-3)
    for previous, block in zip(blocks, blocks[1:]):
        block.add_(previous[..., -1:, :])
    return b.flatten(-3, -2)


def _reverse_cumsum_(x: torch.Tensor) -> torch.Tensor:
    """x [..., C, D] summed from each position to the chunk's end: eager, in place by C row adds
    (flip-cumsum-flip costs two copies and a scalar scan); compiled, that flip-cumsum-flip."""
    if _compiling():
        return x.flip(-2).cumsum(-2).flip(-2)
    rows = x.unbind(-2)
    for later, row in zip(rows[::-1], rows[-2::-1]):
        row.add_(later)
    return x


# ---------------------------------------------------------------- the explicit form, per chunk


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _replace_explicit(explicit, values, explicit_values, inputs):
    """values (each [B, H, N, ...]) with the entries of the explicit chunks ([B, H, N] bool) replaced
    by explicit_values(*inputs, each flattened to [B * H * N, ...]) (decays from a float64 cumulative
    sum, every exponent <= 0)."""
    if _compiling():
        # One graph whatever the gates: cond runs the explicit branch only when some chunk needs it;
        # the branch computes every chunk's explicit values and keeps them where needed. Both
        # branches return flat tensors: under dynamic shapes their strides must agree symbolically.
        def with_explicit(explicit, values, inputs):
            computed = explicit_values(*(x.flatten(0, 2) for x in inputs))
            keep = explicit.view(*explicit.shape, *[1] * (values[0].dim() - 3))
            return tuple(torch.where(keep, full.view(value.shape), value).flatten() for full, value in zip(computed, values))

        def without(explicit, values, inputs):
            return tuple(value.flatten().clone() for value in values)

        flat = torch.cond(explicit.any(), with_explicit, without, (explicit, tuple(values), tuple(inputs)))
        return tuple(x.view(value.shape) for x, value in zip(flat, values))
    if explicit.any():
        index = explicit.flatten().nonzero().squeeze(1)
        for value, computed in zip(values, explicit_values(*(x.flatten(0, 2)[index] for x in inputs))):
            value.flatten(0, 2)[index] = computed
    return tuple(values)


def _explicit_updates(k, v, g):
    """(k exp(B - b))^T v per chunk, from k, g [M, C, K] and v [M, C, V]: [M, K, V], exponents <= 0."""
    b = g.to(torch.float64).cumsum(-2)
    keys_out = k * (b[..., -1:, :] - b).to(k.dtype).exp()
    return keys_out.transpose(-1, -2) @ v


def _add_explicit_grads(grad_q, grad_k, parts: _ChunkParts, grad_scores, scale: float) -> None:
    """Add the explicit chunks' intra-chunk gradients of q and k (the factorised part left them 0)."""
    explicit = parts.explicit
    if _compiling():
        def with_explicit(grad_q, grad_k, q_c, k_c, g_c, grad_scores, explicit):
            dq, dk = _explicit_score_grads(*(x.flatten(0, 2) for x in (q_c, k_c, g_c, grad_scores)), scale)
            keep = explicit[..., None, None]
            dq = torch.where(keep, dq.view(grad_q.shape), 0.0)
            dk = torch.where(keep, dk.view(grad_k.shape), 0.0)
            return (grad_q + dq).flatten(), (grad_k + dk).flatten()

        def without(grad_q, grad_k, q_c, k_c, g_c, grad_scores, explicit):
            return grad_q.flatten().clone(), grad_k.flatten().clone()

        dq, dk = torch.cond(
            explicit.any(), with_explicit, without, (grad_q, grad_k, parts.q_c, parts.k_c, parts.g_c, grad_scores, explicit)
        )
        grad_q.copy_(dq.view(grad_q.shape))
        grad_k.copy_(dk.view(grad_k.shape))
        return
    if explicit.any():
        index = explicit.flatten().nonzero().squeeze(1)
        picked = [x.flatten(0, 2)[index] for x in (parts.q_c, parts.k_c, parts.g_c, grad_scores)]
        dq, dk = _explicit_score_grads(*picked, scale)
        grad_q.flatten(0, 2).index_add_(0, index, dq)
        grad_k.flatten(0, 2).index_add_(0, index, dk)


def _explicit_blocks(q, g):
    """Yield (slice, decay [m, C(i), C(j), K]) over blocks of chunks: decay = exp(min(b_i - b_j, 0)).

    b is summed in float64 so that b_i - b_j keeps its precision when the gates before i are huge
    (b near -1000 and a difference near -1 must not lose 1e-4 to rounding)."""
    chunks, chunk, key_dim = q.shape
    block = max(1, EXPLICIT_BLOCK_ELEMENTS // (chunk * chunk * key_dim))
    b = g.to(torch.float64).cumsum(-2)
    for start in range(0, chunks, block):
        b_block = b[start : start + block]
        log_decay = (b_block.unsqueeze(-2) - b_block.unsqueeze(-3)).clamp_(max=0.0)  # [m, i, j, K]
        yield slice(start, start + block), log_decay.to(q.dtype).exp_()


def _explicit_scores(q, k, g, scale):
    """scores[i, j] = scale sum_K q_i k_j exp(b_i - b_j), j <= i: q, k, g [M, C, K] -> [M, C, C]."""
    rows = []
    for part, decay in _explicit_blocks(q, g):
        rows.append((decay * k[part].unsqueeze(-3) @ q[part].unsqueeze(-1)).squeeze(-1))
    return (torch.cat(rows) * scale).tril_()


def _explicit_score_grads(q, k, g, grad_scores, scale):
    """The vector-Jacobian product of `_explicit_scores` for q and k (g's follows from them)."""
    grad_q, grad_k = [], []
    for part, decay in _explicit_blocks(q, g):
        weighted = decay * (grad_scores[part] * scale).unsqueeze(-1)  # [m, i, j, K]
        grad_q.append((weighted * k[part].unsqueeze(-3)).sum(-2))
        grad_k.append((weighted * q[part].unsqueeze(-2)).sum(-3))
    return torch.cat(grad_q), torch.cat(grad_k)
