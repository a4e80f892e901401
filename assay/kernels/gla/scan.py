"""What every form of the chunked GLA shares: chunk views, batched matmuls over (batch, head, chunk),
the state scans between chunks, and the cumulative gates inside a chunk.

Layout inside the kernel: [B, H, N, C, D] (N chunks of C tokens), views of the public [B, T, H, D]
tensors until the first elementwise op writes a contiguous result.
"""

from __future__ import annotations

import itertools

import torch

# The eager cumulative gate sums rows this many positions apart at once (`cumulative_gates`); a
# divisor of CHUNK_MULTIPLE.
CUMSUM_BLOCK = 8


def compiling() -> bool:
    return torch.compiler.is_compiling()


def chunked(x: torch.Tensor, chunk_size: int) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, C, D] (a view)
    return x.transpose(1, 2).unflatten(2, (x.shape[1] // chunk_size, chunk_size))


def bmm(a, b, add=None, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """alpha a @ b (+ beta add) over [B, H, N] batch dims as one batched matmul: bmm takes transposed
    operands as they are, where a 5-D matmul would copy them. `add` (a contiguous temporary, as every
    caller passes) is accumulated into in place: an out-of-place baddbmm would first copy it."""
    a3, b3 = a.flatten(0, -3), b.flatten(0, -3)
    if add is None:
        out = torch.bmm(a3, b3) if alpha == 1.0 else torch.baddbmm(a3.new_empty(()), a3, b3, beta=0.0, alpha=alpha)
    else:
        out = add.flatten(0, -3).baddbmm_(a3, b3, beta=beta, alpha=alpha)
    return out.view(*a.shape[:-1], b.shape[-1])


def scan_states(state, chunk_decay, updates):
    """S_{n+1} = exp(B_n) S_n + U_n from [B, H, K, V], [B, H, N, K, 1], [B, H, N, K, V]:
    (the states entering each chunk [B, H, N, K, V], the state after the last). Eager, each entry
    state is written in place into one tensor (no list to stack); compiled, a list and one stack."""
    decays, updates = chunk_decay.unbind(2), updates.unbind(2)  # unbind: one op to split
    if compiling():
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


def reverse_scan(grad_final, chunk_decay, from_outputs):
    """The state gradients, last chunk first: dS_n = exp(B_n) dS_{n+1} + from_outputs_n, from
    [B, H, K, V], [B, H, N, K, 1], [B, H, N, K, V]: (the gradient of each chunk's exit state
    [B, H, N, K, V], that of the initial state). Eager, written in place (no list to stack)."""
    decays, terms = chunk_decay.unbind(2), from_outputs.unbind(2)
    if compiling():
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


def cumulative_gates(g, chunk_size: int, keep_local: bool = False):
    """b [B, H, N, C, K] (contiguous) from g [B, T, H, K]: the log gate summed from each chunk's start;
    with keep_local, (b, local) where local [B, H, N, C / CUMSUM_BLOCK, CUMSUM_BLOCK, K] holds the sums
    from each block of CUMSUM_BLOCK tokens' start (what the sub-chunk form builds its exponents from).

    Eager, in blocks of CUMSUM_BLOCK positions: position by position inside every block at once
    (CUMSUM_BLOCK - 1 adds of [B, H, N, C / CUMSUM_BLOCK, K] rows, each reading g where it is), then
    each block plus the sum of the blocks before it (one add). torch.cumsum over a strided dim of
    length C runs a scalar loop per element (with the exp, 0.68-0.73 ms per 2,048-token segment against
    0.62 ms for these adds; docs/gla.md); and unlike a loop over C single rows, every add here is large
    enough (64K elements at 2,048 tokens, H=4, K=64) for PyTorch to split over threads. Compiled, one
    cumsum (the loops would unroll into nodes)."""
    g_c = chunked(g, chunk_size)
    if compiling():
        return g_c.cumsum(-2)
    blocked = g_c.unflatten(-2, (chunk_size // CUMSUM_BLOCK, CUMSUM_BLOCK))  # [B, H, N, blocks, rows, K]
    local = torch.empty(blocked.shape, dtype=g.dtype, device=g.device)
    rows, g_rows = local.unbind(-2), blocked.unbind(-2)
    rows[0].copy_(g_rows[0])
    for previous, row, g_row in zip(rows, rows[1:], g_rows[1:]):
        torch.add(previous, g_row, out=row)
    if not keep_local:  # each block plus the last row of the one before, in place: the factorised form's fast path
        blocks = local.unbind(-3)
        for previous, block in itertools.pairwise(blocks):
            block.add_(previous[..., -1:, :])
        return local.flatten(-3, -2)
    # Each block's carry (the totals of the blocks before it, small) added into a new tensor, local kept.
    totals = local[..., -1:, :]
    carry = torch.zeros_like(totals)
    torch.cumsum(totals[..., :-1, :, :], dim=-3, out=carry[..., 1:, :, :])
    return torch.add(local, carry).flatten(-3, -2), local


def reverse_cumulative_gates(g, chunk_size: int) -> torch.Tensor:
    """[B, H, N, C, K] (contiguous): the log gate summed from after each position to its chunk's end,
    B - b_i, added up directly (not a difference of two long sums). Row adds from the chunk's end."""
    g_c = chunked(g, chunk_size)
    if compiling():
        return g_c.flip(-2).cumsum(-2).flip(-2) - g_c
    after = torch.empty(g_c.shape, dtype=g.dtype, device=g.device)
    rows, g_rows = after.unbind(-2), g_c.unbind(-2)
    rows[-1].zero_()
    for later, row, g_next in zip(rows[:0:-1], rows[-2::-1], g_rows[:0:-1]):
        torch.add(later, g_next, out=row)
    return after


def reverse_cumsum_(x: torch.Tensor) -> torch.Tensor:
    """x [..., C, D] summed from each position to the chunk's end: eager, in place by C row adds
    (flip-cumsum-flip costs two copies and a scalar scan); compiled, that flip-cumsum-flip."""
    if compiling():
        return x.flip(-2).cumsum(-2).flip(-2)
    rows = x.unbind(-2)
    for later, row in zip(rows[::-1], rows[-2::-1]):
        row.add_(later)
    return x
