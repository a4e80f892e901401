"""The sub-chunk form of a chunk's scores: every exponent bounded, whatever the gates.

The factorised form (factorised.py) writes a chunk's scores as (q exp(b)) (k exp(-b))^T with b the
cumulative log gate from the chunk's start; once a chunk's total decay passes e^-60 that product
overflows. This form cuts the chunk (C tokens, a power of two) into pairs of h-token blocks and
factorises relative to points inside the chunk:

- each pair (2h tokens) relative to its middle m: queries q_i exp(b_i - b_m), keys k_j exp(b_m - b_j).
  Exponents >= 0 appear (the first block's queries, the second's keys), bounded by one h-block's total
  decay; `plan` picks the largest h whose blocks all decay by at most e^HALF_RANGE (60 in float32:
  e^60 |k| is far from float32's 3.4e38, also through a gradient's sum over a block). One matmul per pair.
- between pairs, halves of halves: at every level s = C/2, ..., 2h the right half's rows against the
  left half's columns, relative to the split point m': q_i exp(b_i - b_m') = (pair's queries) times
  exp(b_m - b_m'), k_j exp(b_m' - b_j) = (pair's keys) times exp(b_m' - b_m): per-pair scales <= 1.
- the chunk's state: entry q_i exp(b_i) = queries times exp(b_m), exit k_j exp(B - b_j) = keys times
  exp(B - b_m), the chunk's decay exp(B).
So every full-size tensor is built once (queries, keys: two exps' worth of passes) and each level
costs one pass of per-pair scaling. Gates too strong for h = 2 (a state wiped in one step) get h = 2
with each step's log gate floored at -30: a floored step still passes e^-30 = 1e-13 of what crosses it.

Exponents are sums inside one h-block (from scan.cumulative_gates' 8-token running sums) and, between
blocks, differences of float64 running sums of block totals: after a cumulative gate of -1000 a step of
-1 keeps its digits.

Denormals: on this project's CPU a matmul whose products fall below float32's smallest normal (e^-87)
runs 50x slower, and exp of an argument below -87 30x. So no exp argument goes below -80, and a level's
scale below e^-LOCAL_FLUSH (20) is 0 (it drops local terms decayed below 2e-9): that keeps a level's
products above e^-80 or at zero for the gates measured (bench/gla_bench.py's gate axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.kernels.gla.scan import CUMSUM_BLOCK, bmm, chunked, compiling, cumulative_gates, reverse_cumulative_gates

SMALLEST_HALF = 2


@dataclass(frozen=True)
class Limits:
    half_range: float  # an h-block's largest total decay: the pairs' factors stay in [e^-R, e^R]
    local_flush: float  # a level's scale below e^-this is 0
    state_floor: float  # exp arguments of the state's factors are floored at -this
    state_flush: float  # with the floor, a state factor below e^-this is 0


# float64 (tests' high-precision runs) has the range for far smaller dropped terms.
LIMITS = {torch.float32: Limits(40.0, 20.0, 80.0, 60.0), torch.float64: Limits(300.0, 150.0, 600.0, 600.0)}


@dataclass(frozen=True)
class SubChunkPlan:
    chunk: int  # C: tokens per chunk, a power of two
    half: int  # h: the blocks paired on the diagonal, a power of two from 2 to C/2
    floor: float | None  # each step's log gate floored at -floor (h = 2 only), or None


def internal_chunk(chunk_size: int) -> int:
    """The largest power of two dividing chunk_size (a multiple of 16): the halving needs powers of two."""
    return chunk_size & -chunk_size


def strongest_plan(chunk_size: int, dtype: torch.dtype) -> SubChunkPlan:
    """The plan that is safe for any gate (blocks of 2, the floor): what a compiled graph runs."""
    return SubChunkPlan(internal_chunk(chunk_size), SMALLEST_HALF, LIMITS[dtype].half_range / SMALLEST_HALF)


def plan(local: torch.Tensor, chunk: int) -> SubChunkPlan:
    """The largest h whose blocks all decay by at most e^half_range, from the per-8-token-block running
    sums `local` [B, H, N, C/8, 8, K] of scan.cumulative_gates (C = chunk, a power of two). Eager only."""
    limit = LIMITS[local.dtype].half_range
    size = chunk // 2
    while size >= SMALLEST_HALF:
        if _block_totals(local, size).min() >= -limit:
            return SubChunkPlan(chunk, size, None)
        size //= 2
    return strongest_plan(chunk, local.dtype)


def _block_totals(local: torch.Tensor, size: int) -> torch.Tensor:
    """Totals of blocks of `size` tokens from the 8-token blocks' running sums (approximate below 8: a
    difference of two running sums; plan only compares them with a limit)."""
    if size >= CUMSUM_BLOCK:
        return local[..., -1, :].unflatten(-2, (-1, size // CUMSUM_BLOCK)).sum(-2)
    ends = local[..., size - 1 :: size, :]  # [B, H, N, C/8, 8/size, K]: the running sum at each block's end
    return torch.cat([ends[..., :1, :], ends[..., 1:, :] - ends[..., :-1, :]], dim=-2)


def _prefix(local: torch.Tensor | None, g_c: torch.Tensor, plan: SubChunkPlan) -> torch.Tensor:
    """Inclusive prefix sums of g inside h-blocks, [B, H, N, C/h, h, K] contiguous, from the 8-token
    blocks' running sums `local` (consumed) or, with the floor, from the floored gates directly."""
    half, key_dim = plan.half, g_c.shape[-1]
    if plan.floor is not None:  # h = 2: [g_0, g_0 + g_1], floored
        if compiling():
            floored = g_c.clamp(min=-plan.floor).contiguous()
        else:
            floored = torch.clamp(g_c, min=-plan.floor, out=torch.empty(g_c.shape, dtype=g_c.dtype, device=g_c.device))
        pairs = floored.unflatten(-2, (-1, 2))
        pairs[..., 1, :] += pairs[..., 0, :]
        return pairs
    if half < CUMSUM_BLOCK:  # each sub-block minus the running sum at the end of the one before
        blocks = local.unflatten(-2, (CUMSUM_BLOCK // half, half))
        blocks[..., 1:, :, :] -= blocks[..., :-1, -1:, :].clone()
        return blocks.reshape(*local.shape[:3], -1, half, key_dim)
    if half > CUMSUM_BLOCK:  # each 8-token block plus the totals of the ones before it inside the h-block
        per_half = local.unflatten(-3, (-1, half // CUMSUM_BLOCK))  # [B, H, N, C/h, h/8, 8, K]
        ends = per_half[..., -1:, :]
        carry = torch.cat([torch.zeros_like(ends[..., :1, :, :]), ends[..., :-1, :, :].cumsum(-3)], dim=-3)
        per_half += carry
        return per_half.reshape(*local.shape[:3], -1, half, key_dim)
    return local


def _scale(exponents: torch.Tensor, dtype: torch.dtype, floor: float, drop: torch.Tensor | None = None) -> torch.Tensor:
    """exp of a small [..., K] tensor of exponents (<= 0, float64) in `dtype`, the argument floored at
    -floor (exp's slow path starts below -87), and 0 where `drop` (a bool tensor) is set."""
    scale = exponents.to(dtype, copy=True).clamp_(min=-floor).exp_()
    return scale if drop is None else scale.masked_fill_(drop, 0.0)


def _into_new(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) written into a new contiguous tensor: with one operand a strided view of q or k, the
    output's layout would otherwise follow that view (and a compiled graph's guess of it may differ)."""
    if compiling():  # no out= in a graph: its functional form would keep the input's layout after all
        return op(a, b).contiguous()
    out = torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    return op(a, b, out=out)


def _state_factor(exponents: torch.Tensor, flush: float) -> torch.Tensor:
    """exp of full-size exponents (<= 0, consumed), 0 below e^-flush (normal numbers or zeros only)."""
    return torch.nn.functional.threshold_(exponents.clamp_(min=-flush - 1.0).exp_(), math.exp(-flush), 0.0)


def _block_view(scores: torch.Tensor, size: int, diagonal: bool) -> torch.Tensor:
    """scores [M, C, C] -> a view [M, n, size, size]: the diagonal blocks of `size` (diagonal) or, inside
    each diagonal block of 2 size, its lower-left block (the right half's rows, the left half's columns)."""
    span = size if diagonal else 2 * size
    n = scores.shape[-1] // span
    grid = scores.view(scores.shape[0], n, span, n, span).diagonal(dim1=1, dim2=3)  # [M, span, span, n]
    if not diagonal:
        grid = grid[:, size:, :size]
    return grid.permute(0, 3, 1, 2)


class SubChunkParts:
    """The per-chunk tensors of the sub-chunk form from q, k, g [B, T, H, K] (T a multiple of plan.chunk)
    and `local` (scan.cumulative_gates' running sums at plan.chunk, consumed; None with the floor).

    scores [B, H, N, C, C] (times scale, 0 above the diagonal), queries_entry / keys_exit [B, H, N, C, K]
    (q exp(b), k exp(B - b)), chunk_decay [B, H, N, K, 1] (exp(B)), and what the backward reuses."""

    def __init__(self, q, k, g, local, plan: SubChunkPlan, scale: float, b: torch.Tensor | None = None):
        self.plan, self.scale = plan, scale
        limits = LIMITS[g.dtype]
        chunk, half = plan.chunk, plan.half
        width = 2 * half
        self.q_c, self.k_c = chunked(q, chunk), chunked(k, chunk)  # [B, H, N, C, K] views
        self.lead = self.q_c.shape[:3]
        prefix = _prefix(local, chunked(g, chunk), plan)  # [B, H, N, C/h, h, K]
        totals = prefix[..., -1, :].clone()  # [B, H, N, C/h, K]: each h-block's total
        # Relative to each pair's middle: the first block's prefix minus its total (-suffix, >= 0), the
        # second block's prefix (<= 0). decay = exp of that, in [e^-R, e^R].
        exponents = prefix.reshape(*self.lead, chunk // width, 2, half, -1)
        exponents[..., 0, :, :] -= totals.view(*self.lead, chunk // width, 2, 1, -1)[..., 0, :, :]
        self.decay = exponents.exp_().contiguous()  # [B, H, N, C/2h, 2, h, K]
        # decay first: the product takes its contiguous layout (q's view is strided)
        per_pair = (chunk // width, 2, half)
        self.queries = _into_new(torch.mul, self.decay, self.q_c.unflatten(-2, per_pair))
        self.keys = _into_new(torch.div, self.k_c.unflatten(-2, per_pair), self.decay)

        # Running sums of whole h-blocks in float64 (small tensors): at each pair's middle, and the total.
        totals64 = totals.double()
        running = totals64.cumsum(-2)  # [B, H, N, C/h, K]: through each block
        self.middles = running[..., 0::2, :]  # [B, H, N, C/2h, K]: b at each pair's middle
        dtype, flush = totals.dtype, limits.local_flush
        pair_start, pair_end = self.middles - totals64[..., 0::2, :], running[..., 1::2, :]

        # The chunk's state. Entry q exp(b): the first block's queries (>= 1) go to q exp(prefix) first
        # (times exp(its total)) and then take exp(b) at the pair's start, the second block's take exp(b)
        # at the middle; exit k exp(B - b) likewise from the pair's end and middle. Each pair scale is then
        # <= 1 on a factor <= |q|, |k|; one below e^-flush is 0 (with the pair-local part >= e^-R, every
        # factor is 0 or >= e^-(flush + R): its products with the state or v are no denormals). That drops
        # terms decayed by more than e^-20 = 2e-9 since the chunk's start: for a channel whose state holds
        # the last n tokens at full weight, an error of at most 2e-9 n of one token's term.
        def state_scale(exponents):  # [B, H, N, C/2h, K] -> [B, H, N, C/2h, 1, K]
            return _scale(exponents, dtype, flush + 1.0, exponents < -flush).unsqueeze(-2)

        if plan.floor is None:
            first_total, second_total = (totals[..., i::2, :].exp().unsqueeze(-2) for i in (0, 1))
            self.entry_scales = (first_total, state_scale(pair_start), state_scale(self.middles))
            self.exit_scales = (state_scale(running[..., -1:, :] - self.middles), second_total, state_scale(running[..., -1:, :] - pair_end))
            self.queries_entry = self._to_state(self.queries, self.entry_scales, first=True).reshape(*self.lead, chunk, -1)
            self.keys_exit = self._to_state(self.keys, self.exit_scales, first=False).reshape(*self.lead, chunk, -1)
            total = running[..., -1, :]
            self.chunk_decay = _scale(total, dtype, flush + 1.0, total < -flush).unsqueeze(-1)  # [B, H, N, K, 1]
        else:
            # A floored step must not leak the history through the state (nor pass the initial state's
            # gradient): entry, exit and the chunk's decay from the unfloored gates, 0 below e^-state_flush.
            b = cumulative_gates(g, chunk) if b is None else b  # [B, H, N, C, K]: from the chunk's start
            after = reverse_cumulative_gates(g, chunk)  # B - b: from after each position to the chunk's end
            self.entry_factor, self.exit_factor = (_state_factor(x, limits.state_flush) for x in (b, after))
            self.queries_entry = _into_new(torch.mul, self.entry_factor, self.q_c)
            self.keys_exit = _into_new(torch.mul, self.exit_factor, self.k_c)
            self.chunk_decay = self.entry_factor[..., -1, :].unsqueeze(-1).clone()

        # A level's pair is dropped when even its nearest token is decayed below e^-flush across the split
        # (its first token for rows, its last for columns); a kept pair's factors are >= e^-(flush + 2R).
        self.tiny = math.exp(-2 * flush)
        q_pairs, k_pairs = self.q_c.unflatten(-2, per_pair), self.k_c.unflatten(-2, per_pair)
        self.levels = []  # (size, rows, cols, row factors, column factors), largest first
        size = chunk // 2
        while size >= width:
            pairs = self._halves(self.middles.unsqueeze(-2), size)  # [B, H, N, n, 2, m, 1, K]
            split = self._halves(pair_end.unsqueeze(-2), size)[..., 0, -1:, :, :]  # b at the split: [B, H, N, n, 1, 1, K]
            row_drop = self._halves(pair_start.unsqueeze(-2), size)[..., 1, :, :, :] - split < -flush
            col_drop = split - self._halves(pair_end.unsqueeze(-2), size)[..., 0, :, :, :] < -flush
            row_scale = _scale(pairs[..., 1, :, :, :] - split, dtype, limits.state_floor, row_drop).unsqueeze(-2)
            col_scale = _scale(split - pairs[..., 0, :, :, :], dtype, limits.state_floor, col_drop).unsqueeze(-2)
            # Each factor is 0 or >= e^-2 flush, so that no product of a row and a column is a denormal:
            # exp(b_i - b_split) and exp(b_split - b_j), below e^-2 flush set to 0 (terms below 4e-18).
            row_factor = torch.threshold(torch.mul(self._halves(self.decay, size)[..., 1, :, :, :, :], row_scale), self.tiny, 0.0)
            col_factor = torch.threshold(torch.div(col_scale, self._halves(self.decay, size)[..., 0, :, :, :, :]), self.tiny, 0.0)
            rows = _into_new(torch.mul, row_factor, self._halves(q_pairs, size)[..., 1, :, :, :, :])  # [B, H, N, n, m, 2, h, K]
            cols = _into_new(torch.mul, col_factor, self._halves(k_pairs, size)[..., 0, :, :, :, :])
            self.levels.append((size, rows, cols, row_factor, col_factor))
            size //= 2
        self.scores = self._assemble()

    @staticmethod
    def _to_state(x: torch.Tensor, scales, first: bool) -> torch.Tensor:
        """queries (first) or keys [B, H, N, C/2h, 2, h, K] times their state scales, in two steps on the
        block whose pair-local factors exceed 1 (the first block's queries, the second's keys)."""
        two_step, one_step = (0, 1) if first else (1, 0)
        local, far = (scales[0], scales[1]) if first else (scales[1], scales[2])
        near = scales[2] if first else scales[0]
        if compiling():
            halves = [x[..., two_step, :, :] * local * far, x[..., one_step, :, :] * near]
            return torch.stack(halves if first else halves[::-1], dim=-3)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.mul(x[..., two_step, :, :], local, out=out[..., two_step, :, :]).mul_(far)
        torch.mul(x[..., one_step, :, :], near, out=out[..., one_step, :, :])
        return out

    def _halves(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """[B, H, N, C/2h, ...] -> a view [B, H, N, C/(2 size), 2, size/2h, ...]: each 2 size-block's halves."""
        return x.view(*self.lead, -1, 2, size // (2 * self.plan.half), *x.shape[4:])

    def _assemble(self) -> torch.Tensor:
        chunk, width, key_dim = self.plan.chunk, 2 * self.plan.half, self.q_c.shape[-1]
        diagonal = bmm(self.queries.reshape(-1, width, key_dim), self.keys.reshape(-1, width, key_dim).transpose(-1, -2), alpha=self.scale).tril_()
        if width == chunk:  # one pair per chunk: its scores are the chunk's
            return diagonal.reshape(*self.lead, chunk, chunk)
        flat = self.lead.numel()
        scores = torch.zeros(flat, chunk, chunk, dtype=diagonal.dtype, device=diagonal.device)
        _block_view(scores, width, diagonal=True).copy_(diagonal.reshape(flat, -1, width, width))
        for size, rows, cols, _, _ in self.levels:
            products = bmm(rows.reshape(-1, size, key_dim), cols.reshape(-1, size, key_dim).transpose(-1, -2), alpha=self.scale)
            _block_view(scores, size, diagonal=False).copy_(products.reshape(flat, -1, size, size))
        return scores.view(*self.lead, chunk, chunk)

    def query_key_grads(self, grad_scores, do, states_before, v_c, grad_after, scale):
        """(grad_q, grad_k) [B, H, N, C, K] from grad_scores [B, H, N, C, C] (do v^T, lower triangle),
        do [B, H, N, C, V], the entry states, v and the exit states' gradients [B, H, N, K, V].

        Collected in the queries' and keys' units (grad_q = A decay, grad_k = B / decay), each term
        first multiplied by its per-pair scale."""
        chunk, width, key_dim = self.plan.chunk, 2 * self.plan.half, self.q_c.shape[-1]
        shape = self.decay.shape
        entry = bmm(do, states_before.transpose(-1, -2), alpha=scale).reshape(shape)  # through q exp(b)
        grad_queries = self._to_state(entry, self.entry_scales, first=True) if self.plan.floor is None else torch.zeros(shape, dtype=entry.dtype, device=entry.device)
        exit_ = bmm(v_c, grad_after.transpose(-1, -2)).reshape(shape)  # through k exp(B - b)
        grad_keys = self._to_state(exit_, self.exit_scales, first=False) if self.plan.floor is None else torch.zeros(shape, dtype=exit_.dtype, device=exit_.device)
        grads = grad_scores.reshape(-1, chunk, chunk)
        if width < chunk:
            grads = _block_view(grads, width, diagonal=True)
        grads = grads.reshape(-1, width, width)
        grad_queries.view(-1, width, key_dim).baddbmm_(grads, self.keys.view(-1, width, key_dim), alpha=scale)
        grad_keys.view(-1, width, key_dim).baddbmm_(grads.transpose(-1, -2), self.queries.view(-1, width, key_dim), alpha=scale)
        grad_q, grad_k = grad_queries.mul_(self.decay), grad_keys.div_(self.decay)  # q's and k's own units from here
        if self.plan.floor is not None:  # the state's factors in q's and k's own units
            grad_q.view(*self.lead, chunk, key_dim).addcmul_(entry.view(*self.lead, chunk, key_dim), self.entry_factor)
            grad_k.view(*self.lead, chunk, key_dim).addcmul_(exit_.view(*self.lead, chunk, key_dim), self.exit_factor)
        for size, rows, cols, row_factor, col_factor in self.levels:
            grads = _block_view(grad_scores.reshape(-1, chunk, chunk), size, diagonal=False).reshape(-1, size, size)
            grad_rows = bmm(grads, cols.reshape(-1, size, key_dim), alpha=scale).reshape(rows.shape)
            grad_cols = bmm(grads.transpose(-1, -2), rows.reshape(-1, size, key_dim), alpha=scale).reshape(cols.shape)
            self._halves(grad_q, size)[..., 1, :, :, :, :].addcmul_(grad_rows, row_factor)
            self._halves(grad_k, size)[..., 0, :, :, :, :].addcmul_(grad_cols, col_factor)
        return grad_q.reshape(*self.lead, chunk, key_dim), grad_k.reshape(*self.lead, chunk, key_dim)
