"""The factorised form of a chunk's scores: one matmul per chunk, for gates that stay in range.

With b the cumulative log gate from the chunk's start (b_i <= 0) and B = b_C its total:

    S_ij = scale q_i . k_j exp(b_i - b_j) = scale (q exp(b))_i . (k exp(-b))_j        (j <= i)

Exact in float32 while B >= -FACTORISED_LOG_RANGE in every key channel of every chunk: the larger
factor is at most e^60 |k|, the discarded upper triangle at most e^60 K |q| |k| (float32 holds 3e38),
and exp(b) >= e^-60 is never a denormal. The model's gate (logsigmoid(x) / 16, about -0.05 per step)
keeps chunks of 128 tokens in range; stronger gates go to the sub-chunk form (sub_chunk.py), which
`gla_chunk` picks for the whole segment when any chunk is out of range.
"""

from __future__ import annotations

import torch

from assay.kernels.gla.scan import bmm, chunked, cumulative_gates, scan_states

# The factorised form's factors reach e^RANGE |k|: at 60, e^60 = 1e26, far from float32's 3e38 even
# times K |q| |k|, and exp(b) >= e^-60 stays a normal float32 (no slow, inexact denormals).
FACTORISED_LOG_RANGE = 60.0


def eager_forward(q, k, v, g, state, scale: float, chunk_size: int, b: torch.Tensor | None = None):
    """The forward without a compiler, in the fewest full-size passes, from [B, T, H, D] inputs (T a
    multiple of C): (o [B, T, H, V], final state, the [B, H, N, K, V] states entering each chunk), or None
    when some chunk's total decay is out of range (then only the cumulative gates b were computed: pass
    b = cumulative_gates(g, chunk_size) to keep them).

    One decay factor per position, exp(b); queries q exp(b), keys k exp(-b) (at most e^RANGE |k|);
    each chunk's update (k exp(-b))^T v scaled by exp(B) after the matmul ([K, V] rows, not [C, K] keys)."""
    b = cumulative_gates(g, chunk_size) if b is None else b  # [B, H, N, C, K]
    # b_i >= B (gates <= 0): every chunk's total in range keeps every exp(-b) <= e^RANGE.
    if b[..., -1, :].amin() < -FACTORISED_LOG_RANGE:
        return None
    decay_in = b.exp_()  # exp(b), contiguous
    chunk_decay = decay_in[..., -1, :].unsqueeze(-1).clone()  # [B, H, N, K, 1]: exp(B)
    q_c, k_c, v_c = (chunked(x, chunk_size) for x in (q, k, v))
    queries_in = torch.mul(decay_in, q_c)  # decay first: the result takes its contiguous layout
    keys_in = torch.div(k_c, decay_in, out=decay_in)  # k exp(-b), in exp(b)'s memory
    v_c = v_c.contiguous()  # [B, H, N, C, V]
    scores = bmm(queries_in, keys_in.transpose(-1, -2), alpha=scale).tril_()
    updates = bmm(keys_in.transpose(-1, -2), v_c).mul_(chunk_decay)  # (k exp(B - b))^T v
    states, final = scan_states(state, chunk_decay, updates)  # [B, H, N, K, V], [B, H, K, V]
    # o = scores v + scale (q exp(b)) S_entry: the second added in place by the same batched matmul.
    o = bmm(scores, v_c)
    o.flatten(0, 2).baddbmm_(queries_in.flatten(0, 2), states.flatten(0, 2), alpha=scale)
    return o.flatten(2, 3).transpose(1, 2), final, states


class FactorisedParts:
    """The per-chunk tensors of the factorised form (what the backward and a compiled forward build),
    from q, k, g [B, T, H, K]: [B, H, N, C, K] unless noted. In range only (see `in_range`).

    Keys as (k exp(B - b)) exp(-B): each factor stays safe for any gate, so a compiled graph may build
    these for every input and let a torch.cond pick the sub-chunk form's result instead."""

    def __init__(self, q, k, g, chunk_size: int, scale: float):
        self.q_c, self.k_c = chunked(q, chunk_size), chunked(k, chunk_size)
        b = cumulative_gates(g, chunk_size)  # log decay from the chunk's start through position i, <= 0
        total = b[..., -1:, :]  # [B, H, N, 1, K]: over the whole chunk
        self.decay_in = b.exp()  # <= 1
        self.decay_out = torch.sub(total, b).exp_()  # from after position j to the chunk's end, <= 1
        # (q exp(b)) (k exp(B - b) exp(-B))^T = q k^T exp(b_i - b_j); the second factor <= e^RANGE |k| in range.
        self.rescale = (-total).clamp(max=FACTORISED_LOG_RANGE).exp_()
        self.queries_entry = torch.mul(self.decay_in, self.q_c)
        self.keys_exit = torch.mul(self.decay_out, self.k_c)
        self.chunk_decay = total.exp().transpose(-1, -2)  # [B, H, N, K, 1]
        self.scores = bmm(self.queries_entry, (self.keys_exit * self.rescale).transpose(-1, -2), alpha=scale).tril_()

    def query_key_grads(self, grad_scores, entry, exit_, scale):
        """(grad_q, grad_k) [B, H, N, C, K] from grad_scores [B, H, N, C, C] and the parts through the states,
        entry = scale do S_entry^T and exit_ = v dS_exit^T [B, H, N, C, K] (added into, in place): the
        intra-chunk part in decayed units, then times the decays."""
        grad_q = bmm(grad_scores, self.keys_exit * self.rescale, add=entry, alpha=scale)
        grad_q.mul_(self.decay_in)
        grad_k = bmm(grad_scores.transpose(-1, -2), self.queries_entry * self.rescale, add=exit_, alpha=scale)
        grad_k.mul_(self.decay_out)
        return grad_q, grad_k
