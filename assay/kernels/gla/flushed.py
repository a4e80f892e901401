"""The state path when every chunk's decay is 0: gates that wipe the state (a sub-chunk plan with a reach,
sub_chunk.py), or 4 logsigmoid(x) over 32-token chunks.

Then the state entering chunk n is chunk n - 1's update alone, S_n = ke_{n-1}^T v_{n-1} (ke: the exit keys,
the last R rows the form keeps, R <= C), and the gradient of the state after chunk n is chunk n + 1's term
alone, dS_n = scale qe_{n+1}^T do_{n+1} (qe: the entry queries, the first R rows). Every product of the
state path becomes an [R, R] product of neighbouring chunks' rows instead of a [K, V] state written, read and
scanned per chunk (4 MB per 2,048 tokens at C = 32, H = 4, K = V = 64). Neighbours are taken in the flat
(B, H, N) order of the chunks; a product that pairs one sequence's last chunk with the next one's first is
zeroed, and the sequence ends take the initial state and the final state's gradient instead.
"""

from __future__ import annotations

import torch

from assay.kernels.gla.scan import bmm


def _neighbours(a: torch.Tensor, b: torch.Tensor, count: int) -> torch.Tensor:
    """a_n b_{n+1}^T for neighbouring chunks [M - 1, ., .] (0 across a sequence's end; count: chunks per sequence)."""
    products = torch.bmm(a[:-1], b[1:].transpose(-1, -2))
    products[count - 1 :: count] = 0.0
    return products


def _add_products(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """target += alpha a @ b, batched. In place into a strided view (some rows of each chunk), baddbmm_ falls
    back to one addmm_ per batch entry (255 calls per 2,048 tokens at R = 4): one bmm, then one add."""
    if target.is_contiguous():
        target.baddbmm_(a, b, alpha=alpha)
    else:
        target.add_(torch.bmm(a, b), alpha=alpha)


def flushed_forward(parts, v_c: torch.Tensor, state: torch.Tensor, scale: float):
    """(o [B, T, H, V], the final state) from a form's parts, v [B, H, N, C, V] and the initial state:
    o_n = scores_n v_n + scale qe_n S_n, with S_n = ke_{n-1}^T v_{n-1}: scale (qe_n ke_{n-1}^T) v_{n-1}."""
    batch, heads, count, chunk, value_dim = v_c.shape
    queries, keys = parts.queries_entry.flatten(0, 2), parts.keys_exit.flatten(0, 2)  # [M, R, K], M = B H N
    entry_rows, exit_rows = queries.shape[1], keys.shape[1]
    values = v_c.flatten(0, 2)[:, chunk - exit_rows :]  # [M, R, V]: the values of each chunk's exit keys
    o = bmm(parts.scores, v_c).flatten(0, 2)  # [M, C, V]
    _add_products(o[1:, :entry_rows], _neighbours(keys, queries, count).transpose(-1, -2), values[:-1], scale)
    seqs = batch * heads
    firsts = o.view(seqs, count, chunk, value_dim)[:, 0, :entry_rows]
    _add_products(firsts, queries.view(seqs, count, entry_rows, -1)[:, 0], state.flatten(0, 1), scale)
    last_keys = keys.view(seqs, count, exit_rows, -1)[:, -1]
    final = torch.bmm(last_keys.transpose(-1, -2), values.view(seqs, count, exit_rows, value_dim)[:, -1])
    return o.view(v_c.shape).flatten(2, 3).transpose(1, 2), final.view(state.shape)


def flushed_state_grads(parts, do, v_c, state, grad_final, grad_v, scale: float):
    """What the backward needs of the state path, from do and v [B, H, N, C, V], the initial state and the
    final state's gradient [B, H, K, V]: (entry = scale do S_entry^T [B, H, N, R, K], exit_ = v dS_exit^T
    [B, H, N, R, K], the initial state's gradient); the exit keys' part of v's gradient, ke dS_exit, is
    added into grad_v [B, H, N, C, V] in place."""
    batch, heads, count, chunk, value_dim = v_c.shape
    seqs = batch * heads
    queries, keys = parts.queries_entry.flatten(0, 2), parts.keys_exit.flatten(0, 2)
    entry_rows, exit_rows = queries.shape[1], keys.shape[1]
    do_in = do.flatten(0, 2)[:, :entry_rows]  # [M, R, V]: the output gradients of the entry rows
    values = v_c.flatten(0, 2)[:, chunk - exit_rows :]
    grad_values = grad_v.flatten(0, 2)[:, chunk - exit_rows :]
    # dS_n = scale qe_{n+1}^T do_{n+1}: v_n dS_n^T = scale (v_n do_{n+1}^T) qe_{n+1}, ke_n dS_n = scale (ke_n qe_{n+1}^T) do_{n+1};
    # S_n = ke_{n-1}^T v_{n-1}: scale do_n S_n^T = scale (do_n v_{n-1}^T) ke_{n-1}.
    pairs = _neighbours(values, do_in, count)  # [M - 1, R, R]: v_n do_{n+1}^T
    exit_ = torch.empty_like(keys)
    exit_[:-1].baddbmm_(pairs, queries[1:], beta=0.0, alpha=scale)
    exit_[-1].zero_()
    _add_products(grad_values[:-1], _neighbours(keys, queries, count), do_in[1:], scale)
    entry = torch.empty_like(queries)
    entry[1:].baddbmm_(pairs.transpose(-1, -2), keys[:-1], beta=0.0, alpha=scale)
    # The sequences' ends: the final state's gradient after the last chunk, the initial state before the first.
    grad_final = grad_final.flatten(0, 1)
    last_values = values.view(seqs, count, exit_rows, value_dim)[:, -1]
    _add_products(exit_.view(seqs, count, exit_rows, -1)[:, -1], last_values, grad_final.transpose(-1, -2))
    _add_products(grad_values.view(seqs, count, exit_rows, value_dim)[:, -1], keys.view(seqs, count, exit_rows, -1)[:, -1], grad_final)
    first_do = do_in.view(seqs, count, entry_rows, value_dim)[:, 0]
    entry.view(seqs, count, entry_rows, -1)[:, 0] = bmm(first_do, state.flatten(0, 1).transpose(-1, -2), alpha=scale)
    grad_state = bmm(queries.view(seqs, count, entry_rows, -1)[:, 0].transpose(-1, -2), first_do, alpha=scale)
    lead = v_c.shape[:3]
    return entry.view(*lead, entry_rows, -1), exit_.view(*lead, exit_rows, -1), grad_state.view(state.shape)
