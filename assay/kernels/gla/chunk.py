"""`gla_chunk`: the chunkwise-parallel GLA in plain PyTorch, its autograd Function, and the choice of form.

The sequence is cut into chunks of C tokens; within a chunk, outputs are a masked [C, C] score
matrix times v (parallel over chunks); between chunks only a [K, V] state per head travels (a loop
over chunks). Two forms of the scores, chosen per 2,048-token segment from the gates:
- factorised (factorised.py): one matmul per chunk, while every chunk's total decay stays in range
  (the model's gate, logsigmoid(x) / 16, and anything up to about four times as strong);
- sub-chunk (sub_chunk.py): halves of halves, every exponent bounded by one small block's decay, for
  any gate up to one that wipes the state at every step. Its cost does not depend on the gates beyond
  the size of its diagonal blocks, so stronger gates never fall off a cliff.
Forward and backward are written out (`_GLAChunkFunction`): the backward recomputes the per-chunk
tensors from q, k, v, g and the chunk-entry states, so autograd keeps O(T K) per head, not O(T C K).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assay.kernels.gla.factorised import (
    FACTORISED_LOG_RANGE,
    FactorisedParts,
    eager_forward,
)
from assay.kernels.gla.flushed import flushed_forward, flushed_state_grads
from assay.kernels.gla.reference import (
    accumulation_dtype,
    check_chunk_size,
    check_inputs,
)
from assay.kernels.gla.scan import (
    bmm,
    chunked,
    compiling,
    cumulative_gates,
    reverse_cumsum_,
    reverse_scan,
    scan_states,
)
from assay.kernels.gla.sub_chunk import (
    SubChunkParts,
    internal_chunk,
    plan,
    strongest_plan,
)

# gla_chunk works through the sequence this many tokens (rounded down to whole chunks) at a time:
# one segment's [T, H, K] intermediates (2 MB at H=4, K=64 in float32) stay near this CPU's 2 MB L2
# per core, and only one [K, V] state crosses a segment boundary; each segment costs about 0.4 ms of
# fixed op overhead. At 4K tokens on 2 threads 2048 was faster than 1024 and than one segment.
SEGMENT_TOKENS = 2048
# The form a compiled graph records: it decides with a torch.cond inside the graph, not in Python.
COMPILED = "compiled"


def gla_chunk(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunkwise-parallel GLA, equal to `gla_recurrent` within the ("recurrence", dtype) tolerance.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] or None.
    Returns (o [B, T, H, V] in q's dtype, final_state [B, H, K, V] in the accumulation dtype, or None).
    chunk_size: a multiple of 16 from 16 to 128 (AssayError otherwise); T need not be a multiple of it.
    """
    check_chunk_size(chunk_size)
    batch, time, heads, key_dim, value_dim = check_inputs(q, k, v, g, initial_state)
    chunk_size = fitted_chunk_size(time, chunk_size)
    scale = key_dim**-0.5 if scale is None else float(scale)
    accum = accumulation_dtype(q.dtype)
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


def fitted_chunk_size(time, chunk_size: int) -> int:
    """The chunk a sequence of `time` tokens runs in: `chunk_size`, or for a sequence shorter than one chunk
    the smallest power of two from 16 that holds it. A 16-token sequence padded to a 64-token chunk would
    do 4x the work of its own chunk on padding (MQAR's short stage trains at 16 tokens); one chunk either
    way, so the result is the same up to float rounding. A symbolic length (a dynamic-shape graph) keeps
    `chunk_size`: no guard on the length."""
    if not isinstance(time, int) or time >= chunk_size:
        return chunk_size
    fitted = 16
    while fitted < time:
        fitted *= 2
    return min(fitted, chunk_size)


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
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs) or compiling():
        o, state, _, _ = _GLAChunkFunction.apply(*inputs, scale, chunk_size)
    else:  # nothing to differentiate (inference, prefill): the Function's bookkeeping costs 60 us a call
        o, state, _, _ = _GLAChunkFunction.forward(*inputs, scale, chunk_size)
    return (o[:, :time] if pad else o), state


class _GLAChunkFunction(torch.autograd.Function):
    """GLA over whole chunks: q, k, g [B, T, H, K], v [B, T, H, V] (T a multiple of C), state [B, H, K, V].

    Returns (o [B, T, H, V], final state, the [B, H, N, K, V] states entering each chunk, the form: None
    for factorised, a SubChunkPlan, or COMPILED); saves only its inputs and those states: the backward
    recomputes decays and scores from them (no O(T * C) tensor alive between forward and backward).
    setup_context form, so that torch.func (gla_op's VJP) can run it too.
    """

    @staticmethod
    def forward(q, k, v, g, initial_state, scale, chunk_size):
        if compiling():
            return (*_compiled_forward(q, k, v, g, initial_state, scale, chunk_size), COMPILED)
        b = cumulative_gates(g, chunk_size)
        result = eager_forward(q, k, v, g, initial_state, scale, chunk_size, b)
        if result is not None:
            return (*result, None)
        form = plan(b, internal_chunk(chunk_size))
        parts = SubChunkParts(q, k, g, form, scale)
        return (*_forward_from_parts(parts, v, initial_state, scale, form.chunk), form)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, g, initial_state, scale, chunk_size = inputs
        _, final, states, form = output
        # No states: every chunk's decay was 0 (flushed.py), the backward needs only the initial one.
        ctx.flushed = states is None
        ctx.save_for_backward(q, k, v, g, initial_state if ctx.flushed else states, final)
        if not ctx.flushed:
            ctx.mark_non_differentiable(states)
        # Unused outputs (always the states) reach backward as None, not as zero tensors filled for nothing.
        ctx.set_materialize_grads(False)
        ctx.scale, ctx.chunk_size, ctx.form = scale, chunk_size, form

    @staticmethod
    def backward(ctx, grad_o, grad_final, _states, _form):
        q, k, v, g, states_before, final = ctx.saved_tensors
        scale, chunk_size, form = ctx.scale, ctx.chunk_size, ctx.form
        if grad_o is None:
            grad_o = torch.zeros_like(v)
        if grad_final is None:
            grad_final = torch.zeros_like(final)
        saved = (q, k, v, g, states_before, final, grad_o, grad_final, scale)
        if form is None:
            grads = _backward_body(FactorisedParts(q, k, g, chunk_size, scale), *saved, chunk_size)
        elif form == COMPILED:
            grads = _compiled_backward(saved, chunk_size)
        else:
            parts = SubChunkParts(q, k, g, form, scale)
            grads = _backward_body(parts, *saved, form.chunk, ctx.flushed)
        return (*grads, None, None)


def _forward_from_parts(parts, v, state, scale: float, chunk: int):
    """(o [B, T, H, V], final state, entry states [B, H, N, K, V], or None when every chunk's decay is 0)
    from a form's per-chunk tensors."""
    v_c = chunked(v, chunk).contiguous()  # [B, H, N, C, V]
    if not compiling() and not parts.chunk_decay.any():
        return (*flushed_forward(parts, v_c, state, scale), None)
    # The sub-chunk form with a reach R < C hands only the chunk's last R keys and first R queries to the states.
    exit_rows, entry_rows = parts.keys_exit.shape[-2], parts.queries_entry.shape[-2]
    updates = bmm(parts.keys_exit.transpose(-1, -2), v_c[..., chunk - exit_rows :, :])  # [B, H, N, K, V]: each chunk's keys at its end
    states, final = scan_states(state, parts.chunk_decay, updates)
    # o = scores v + scale (q exp(b)) S_entry, the second added inside the batched matmul.
    o = bmm(parts.scores, v_c)
    bmm(parts.queries_entry, states, add=o[..., :entry_rows, :], alpha=scale)
    o = o.flatten(2, 3).transpose(1, 2)
    # Compiled, o is made contiguous: its gradient then arrives contiguous too, which the backward's torch.cond
    # branches (traced with contiguous operands) assert.
    return (o.contiguous() if compiling() else o), final, states


def _backward_body(parts, q, k, v, g, states_before, final, grad_o, grad_final, scale, chunk: int, flushed: bool = False):
    """Gradients of q, k, v, g ([B, T, H, D] views) and of the initial state, through a form's parts.
    flushed: every chunk's decay is 0 and states_before is the initial state alone (flushed.py)."""
    v_c = chunked(v, chunk).contiguous()
    do = chunked(grad_o, chunk).contiguous()  # [B, H, N, C, V]
    grad_scores = bmm(do, v_c.transpose(-1, -2)).tril_()  # [B, H, N, C, C]
    grad_v = bmm(parts.scores.transpose(-1, -2), do)
    if flushed:
        entry, exit_, grad_state = flushed_state_grads(parts, do, v_c, states_before, grad_final, grad_v, scale)
    else:
        exit_rows, entry_rows = parts.keys_exit.shape[-2], parts.queries_entry.shape[-2]  # C, or a sub-chunk form's reach
        # State gradients, last chunk first: dS_n = exp(B_n) dS_{n+1} + scale (q exp(b))_n^T do_n.
        from_outputs = bmm(parts.queries_entry.transpose(-1, -2), do[..., :entry_rows, :], alpha=scale)  # [B, H, N, K, V]
        grad_after, grad_state = reverse_scan(grad_final, parts.chunk_decay, from_outputs)  # of each exit state
        bmm(parts.keys_exit, grad_after, add=grad_v[..., chunk - exit_rows :, :])
        entry = bmm(do[..., :entry_rows, :], states_before.transpose(-1, -2), alpha=scale)  # scale do S_entry^T
        exit_ = bmm(v_c[..., chunk - exit_rows :, :], grad_after.transpose(-1, -2))  # v dS_exit^T
    grad_q, grad_k = parts.query_key_grads(grad_scores, entry, exit_, scale)

    # g: scores depend on b_i - b_j only, so db = q dq - k dk; the chunk total B also scales the
    # exit state (exp(B) S_entry + keys_exit^T v, both linear in exp(B) per key channel's row).
    grad_b = torch.mul(grad_q, parts.q_c).addcmul_(grad_k, parts.k_c, value=-1.0)
    # The state after chunk n is the one entering n + 1 (the final state after the last): no cat.
    exit_terms = grad_b[..., -1, :]  # [B, H, N, K]
    if flushed:  # S_{n+1} = keys_exit^T v alone: sum_v dS_{n+1} S_{n+1} = sum over the exit rows of keys_exit (v dS^T)
        exit_terms += (parts.keys_exit * exit_).sum(-2)
    else:
        exit_terms[:, :, :-1] += (grad_after[:, :, :-1] * states_before[:, :, 1:]).sum(-1)
        exit_terms[:, :, -1] += (grad_after[:, :, -1] * final).sum(-1)
    grad_g = reverse_cumsum_(grad_b)  # b_i sums g_t for t <= i

    def back(x):  # [B, H, N, C, D] -> [B, T, H, D] (a view)
        return x.flatten(2, 3).transpose(1, 2)

    return back(grad_q), back(grad_k), back(grad_v), back(grad_g), grad_state


# ---------------------------------------------------------------- compiled: the choice inside the graph


def _in_range(g, chunk: int) -> torch.Tensor:
    return (chunked(g, chunk).sum(-2) >= -FACTORISED_LOG_RANGE).all()


def _compiled_forward(q, k, v, g, state, scale: float, chunk_size: int):
    """One graph whatever the gates: a torch.cond builds the factorised or the sub-chunk form's parts
    (for any gate: blocks of 2, whose diagonal takes any gate), then the shared scan. Both at a power-of-two chunk."""
    chunk = internal_chunk(chunk_size)
    strongest = strongest_plan(chunk)
    batch, time, heads, key_dim = q.shape
    lead = (batch, heads, time // chunk)

    # Both branches return flat tensors: under dynamic shapes their strides must agree symbolically.
    def factorised(q, k, g):
        parts = FactorisedParts(q, k, g, chunk, scale)
        return tuple(x.contiguous().flatten() for x in (parts.scores, parts.queries_entry, parts.keys_exit, parts.chunk_decay))

    def sub_chunk(q, k, g):
        parts = SubChunkParts(q, k, g, strongest, scale)
        return tuple(x.contiguous().flatten() for x in (parts.scores, parts.queries_entry, parts.keys_exit, parts.chunk_decay))

    operands = tuple(x.contiguous() for x in (q, k, g))
    scores, queries_entry, keys_exit, chunk_decay = torch.cond(_in_range(g, chunk), factorised, sub_chunk, operands)
    parts = _Parts(
        scores=scores.view(*lead, chunk, chunk), queries_entry=queries_entry.view(*lead, chunk, key_dim),
        keys_exit=keys_exit.view(*lead, chunk, key_dim), chunk_decay=chunk_decay.view(*lead, key_dim, 1),
    )
    return _forward_from_parts(parts, v, state, scale, chunk)


def _compiled_backward(saved, chunk_size: int):
    q, k, v, g, states_before, final, grad_o, grad_final, scale = saved
    chunk = internal_chunk(chunk_size)
    strongest = strongest_plan(chunk)
    shapes = [x.shape for x in (q, k, v, g, final)]

    def factorised(*tensors):
        grads = _backward_body(FactorisedParts(tensors[0], tensors[1], tensors[3], chunk, scale), *tensors, scale, chunk)
        return tuple(x.contiguous().flatten() for x in grads)

    def sub_chunk(*tensors):
        q, k, g = tensors[0], tensors[1], tensors[3]
        parts = SubChunkParts(q, k, g, strongest, scale)
        grads = _backward_body(parts, *tensors, scale, chunk)
        return tuple(x.contiguous().flatten() for x in grads)

    # Contiguous operands: a gradient arrives with its output's strides (o is a transposed view), and the
    # branches' compiled graphs assert the layout they were traced with.
    operands = tuple(x.contiguous() for x in (q, k, v, g, states_before, final, grad_o, grad_final))
    flat = torch.cond(_in_range(g, chunk), factorised, sub_chunk, operands)
    return tuple(x.view(shape) for x, shape in zip(flat, shapes))


class _Parts:
    def __init__(self, **tensors):
        self.__dict__.update(tensors)
