"""The sub-chunk form of a chunk's scores: every exponent bounded, whatever the gates (fla's two-level idea).

The factorised form (factorised.py) writes a chunk's scores as (q exp(b)) (k exp(-b))^T with b the
cumulative log gate from the chunk's start; once a chunk's total decay passes e^-60 that product
overflows. This form cuts the chunk (C tokens, a power of two) into blocks of h tokens and works with
exponents relative to each block's own start and end, so that every factor between blocks is <= 1:

- p_i, the log gate summed from the start of i's block through i (a sum inside one block, never the
  difference of two long sums), and T, each block's total. One exp: E = exp(p) (for h = 2 of g clamped at -26, 0 below e^-25).
  Queries Qb = q E (<= |q|): q relative to its block's start.
- the diagonal h x h blocks (j <= i inside one block, decay exp(p_i - p_j)):
  h >= 4: Qb (k / E)^T, one batched matmul. `plan` picks the largest h whose blocks all decay by at most
  e^block_range (60 in float32): k / E <= e^60 |k|, no overflow, no denormal.
  h = 2 (any gate, e.g. one that wipes the state every step): q_i . k_i on the diagonal and
  q_{2a+1} . (k_{2a} exp(g_{2a+1})) below it, row-wise dot products with no decay beyond one step.
- between blocks, halves of halves: at each level s = h, 2h, ..., C/2, the right s-half's rows against the
  left s-half's columns, relative to the split: rows = Qb exp(A) (A: the totals of the right half's blocks
  before the row's), columns = keys relative to their block's end times exp(Z) (Z: the totals of the left
  half's blocks after the column's). Both factors <= 1; one batched matmul per level.
- the chunk's state: entry q exp(b) = q E exp(P) (P: the totals of the blocks before), exit k exp(B - b)
  = keys relative to their block's end times exp(the totals after), the chunk's decay exp(B).
So the full-size work is one exp and a few products whatever the gates; the gates set only h (the number
of levels, log2(C / h)), never an explicit [C, C, K] decay tensor.

Chunks of at most MAX_CHUNK (32) tokens: one level fewer than 64, for twice the state steps.

The reach (`plan`): when every aligned R-token block decays below e^-state_flush in every channel (gates that
wipe the state: R = 4 or 8), a term between tokens that a whole R-block separates is below the terms the
state flush already drops (a chunk decay below e^-60 is 0). Then a level of size s > R keeps only the R
rows after its split and the R columns before it, and the state only each chunk's first R queries and last
R keys; every chunk's decay is 0, so the state path is flushed.py's. Levels and state matmuls shrink by
up to C / R; the plan checks the bound on the gates once per call (a few reductions over b).

Subnormals: none (docs/gla.md, "Subnormal numbers"). Every decay factor is in {0} u [e^-factor_floor, 1]
(e^-25 in float32) except E and the decay to a block's end for h >= 4 (>= e^-60); a factor meets at most one
other factor before it is set to 0 below the floor, so every product is >= e^-85 (normal), and q or k is
multiplied by one combined factor per level and for the state's entry and exit: matmul terms >= e^-50 |q k|.
Dropped: terms whose decay is below e^-25. Checked on every op by SubnormalCheck (tests/ops/test_gla_subnormal.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.kernels.gla.scan import CUMSUM_BLOCK, bmm, chunked, compiling

SMALLEST_BLOCK = 2  # the diagonal by row-wise dot products: any gate
STACK = 16  # the rows of one product at the small levels (`SubChunkParts._span`)
# The eager form's chunk: 32 tokens, one level fewer than 64 for twice the state steps (measured at 4K,
# 1 thread: 4 logsigmoid(x) 1.56x -> 1.41x the /16 gate's forward, wiping gates 1.98x -> 1.80x).
MAX_CHUNK = 32


@dataclass(frozen=True)
class Limits:
    block_range: float  # h >= 4: every h-block's total decay >= -this, so k / E <= e^this |k|
    factor_floor: float  # a decay factor below e^-this is exactly 0 (module docstring: no subnormals)
    state_flush: float  # the reach's bound: terms across a whole R-block decay below e^-this


# float32 (bfloat16 inputs run in float32): E >= e^-60 times a factor >= e^-20 is >= e^-80, a normal number
# (float32's smallest is e^-87.3); two kept factors meet in a matmul term at >= e^-40. float64 (the tests'
# high-precision runs) has the range for far smaller dropped terms.
LIMITS = {torch.float32: Limits(60.0, 25.0, 60.0), torch.float64: Limits(600.0, 100.0, 600.0)}


@dataclass(frozen=True)
class SubChunkPlan:
    chunk: int  # C: tokens per chunk, a power of two
    block: int  # h: tokens per diagonal block, a power of two from 2 to C/2
    # R: a power of two from h to C; below C, every aligned R-token block decays below e^-state_flush in
    # every channel, so no term reaches across a whole one (`SubChunkParts`); None: C, nothing dropped.
    reach: int | None = None


def internal_chunk(chunk_size: int) -> int:
    """The largest power of two dividing chunk_size (a multiple of 16): the halving needs powers of two."""
    return chunk_size & -chunk_size


def strongest_plan(chunk_size: int) -> SubChunkPlan:
    """The plan that is safe for any gate (blocks of 2): what a compiled graph runs."""
    return SubChunkPlan(internal_chunk(chunk_size), SMALLEST_BLOCK)


def plan(b: torch.Tensor, chunk: int) -> SubChunkPlan:
    """The largest h whose blocks all decay by at most e^block_range, and the shortest reach R, from b
    [..., C', K], the log gates summed from each chunk's start (scan.cumulative_gates at any C' that `chunk`
    divides), at a chunk of at most MAX_CHUNK. Eager only: the block totals are differences of b's running
    sums, good enough to compare with the limits."""
    limits = LIMITS[b.dtype]
    chunk = min(chunk, MAX_CHUNK)
    block = chunk // 2
    while block > SMALLEST_BLOCK and _block_totals(b, block, torch.amin) < -limits.block_range:
        block //= 2
    # The reach: gates that wipe the state (-1000 u per step) decay by far more than e^-60 over any 4 or 8
    # tokens; terms across such a block are below what the state flush already drops (module docstring).
    reach = block
    while reach < chunk and _block_totals(b, reach, torch.amax) > -limits.state_flush:
        reach *= 2
    return SubChunkPlan(chunk, block, None if reach >= chunk else reach)


def _block_totals(b: torch.Tensor, size: int, reduce) -> float:
    """reduce (amin or amax) over every aligned size-token block's total decay, from b's running sums."""
    ends = b[..., size - 1 :: size, :]  # the running sum at each block's end
    first = reduce(ends[..., :1, :]).item()
    if ends.shape[-2] == 1:
        return first
    rest = reduce(ends[..., 1:, :] - ends[..., :-1, :]).item()
    return min(first, rest) if reduce is torch.amin else max(first, rest)


def block_prefix(g_c: torch.Tensor, block: int) -> torch.Tensor:
    """[..., C, K] -> [..., C/h, h, K] (new, contiguous): g summed from each h-block's start, inclusive.
    Eager: row adds inside blocks of at most CUMSUM_BLOCK, then each such block plus the one before's last row."""
    x = g_c.unflatten(-2, (-1, block))
    if compiling():
        return x.cumsum(-2)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step = min(block, CUMSUM_BLOCK)
    inner, g_inner = out.unflatten(-2, (-1, step)), x.unflatten(-2, (-1, step))
    rows, g_rows = inner.unbind(-2), g_inner.unbind(-2)
    rows[0].copy_(g_rows[0])
    for previous, row, g_row in zip(rows, rows[1:], g_rows[1:]):
        torch.add(previous, g_row, out=row)
    parts = inner.unbind(-3)
    for previous, part in itertools.pairwise(parts):
        part.add_(previous[..., -1:, :])
    return out


def _products(decay: torch.Tensor, chunk: int, block: int, floor: float):
    """The per-block scales of every level from the blocks' decays exp(T) [M, C/h, K] (each 0 or >= floor):
    yields (size, before, after) for size = h, 2h, ..., C/2 and then (C, before, after, chunk decay), where
    before / after [M, C/h, K] hold, for each block, the product of the decays of the blocks before / after
    it inside its size-block (1 for the first / last). Products of two numbers in {0} u [floor, 1] (floor
    e^-20: a product >= e^-40, normal), each set to exactly 0 below floor (its true value is a decay below
    e^-20 either way); only multiplications, no exp."""
    before, after = torch.ones_like(decay), torch.ones_like(decay)
    spans = decay  # [M, C/size, K]: each size-block's decay
    size = block
    while size < chunk:
        yield size, before, after
        halves = (decay.shape[0], chunk // (2 * size), 2, size // block, decay.shape[-1])
        pairs = spans.view(decay.shape[0], -1, 2, decay.shape[-1])
        F.threshold_(before.view(halves)[:, :, 1].mul_(pairs[:, :, :1]), floor, 0.0)
        F.threshold_(after.view(halves)[:, :, 0].mul_(pairs[:, :, 1:]), floor, 0.0)
        spans = F.threshold_(pairs[:, :, 0] * pairs[:, :, 1], floor, 0.0)
        size *= 2
    yield size, before, after, spans[:, 0]


def _block_view(scores: torch.Tensor, size: int, diagonal: bool) -> torch.Tensor:
    """scores [M, C, C] -> a view [M, n, size, size]: the diagonal blocks of `size` (diagonal) or, inside
    each diagonal block of 2 size, its lower-left block (the right half's rows, the left half's columns)."""
    span = size if diagonal else 2 * size
    n = scores.shape[-1] // span
    grid = scores.view(scores.shape[0], n, span, n, span).diagonal(dim1=1, dim2=3)  # [M, span, span, n]
    if not diagonal:
        grid = grid[:, size:, :size]
    return grid.permute(0, 3, 1, 2)


def _level_view(scores: torch.Tensor, size: int, width: int) -> torch.Tensor:
    """The lower-left blocks of a level (`_block_view`), only their `width` rows and columns next to the split."""
    level = _block_view(scores, size, diagonal=False)
    return level if width == size else level[..., :width, size - width :]


def _width(rows: torch.Tensor) -> int:  # a level's rows [M, C/2s, s/h or R/h, h, K]: tokens kept per half
    return rows.shape[-3] * rows.shape[-2]


def _stacked(products: torch.Tensor, size: int) -> torch.Tensor:
    """[P, span, span] -> a view [P, span/size, size, size] of its diagonal blocks of `size`."""
    span = products.shape[-1]
    n = span // size
    return products.view(-1, n, size, n, size).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)


def _new(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) in a new contiguous tensor (with a strided view of q or k as an operand, the result's layout
    would otherwise follow the view's)."""
    if compiling():
        return op(a, b).contiguous()
    # The shape by hand: torch.broadcast_shapes (Python, torch._refs) takes 20 us a call here, a few times
    # per level.
    pad = a.dim() - b.dim()
    a_shape, b_shape = (1,) * -pad + tuple(a.shape), (1,) * pad + tuple(b.shape)
    shape = tuple(x if y == 1 else y for x, y in zip(a_shape, b_shape))
    out = torch.empty(shape, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    return op(a, b, out=out)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # row-wise dot products over the last dim
    return torch.linalg.vecdot(a, b)


class SubChunkParts:
    """The per-chunk tensors of the sub-chunk form from q, k, g [B, T, H, K] (T a multiple of plan.chunk).

    scores [B, H, N, C, C] (times scale, 0 above the diagonal), queries_entry / keys_exit [B, H, N, R, K]
    (q exp(b), k exp(B - b)), chunk_decay [B, H, N, K, 1] (exp(B)), and what the backward reuses. Every
    decay factor that meets q or k outside the diagonal blocks is one tensor in {0} u [e^-factor_floor, 1]."""

    def __init__(self, q, k, g, plan: SubChunkPlan, scale: float):
        self.plan, self.scale = plan, scale
        limits = LIMITS[g.dtype]
        chunk, block = plan.chunk, plan.block
        self.smallest = block == SMALLEST_BLOCK
        q_c, k_c, g_c = (chunked(x, chunk) for x in (q, k, g))  # [B, H, N, C, K] views
        self.q_c, self.k_c = q_c, k_c
        self.lead, key_dim = q_c.shape[:3], q_c.shape[-1]
        flat = self.lead.numel()
        self.blocks = (flat, chunk // block, block, key_dim)  # [M, C/h, h, K], M = B H N
        # q, k, g as [B, H, N, C/h, h, K] views (no copy); the form's own tensors are contiguous [M, C/h, h, K].
        self.q_b, self.k_b = (x.unflatten(-2, (-1, block)) for x in (q_c, k_c))
        floor = math.exp(-limits.factor_floor)
        if self.smallest:  # E: exp(g) for the first of a pair, exp(g_first + g_second) for the second
            pairs = g_c.unflatten(-2, (-1, 2))
            # exp of arguments clamped just below the floor (a normal result), then 0 below the floor
            low = -limits.factor_floor - 1.0
            if compiling():
                clamped = pairs.clamp(min=low)
            else:  # into a new contiguous tensor (the view's layout would follow g's)
                clamped = torch.clamp(pairs, min=low, out=torch.empty(pairs.shape, dtype=g.dtype, device=g.device))
            self.factor = F.threshold_(clamped.contiguous().view(self.blocks).exp_(), floor, 0.0)
            self.step = self.factor[..., 1, :].clone()  # exp(g_{2a+1}): the first's key to the pair's end
            F.threshold_(self.factor[..., 1, :].mul_(self.factor[..., 0, :]), floor, 0.0)
            self.ends = torch.ones_like(self.factor)  # each key's decay to its block's end: step, 1
            self.ends[..., 0, :].copy_(self.step)
            decay = self.factor[..., -1, :].clone()  # [M, C/h, K]: exp(T), each block's decay
        else:  # E = exp(p) >= e^-R: the plan bounds every block's total
            self.factor = block_prefix(g_c, block).view(self.blocks).exp_()
            self.ends = torch.div(self.factor[..., -1:, :], self.factor)  # exp(T - p) in [e^-R, 1]
            decay = F.threshold(self.factor[..., -1, :], floor, 0.0)
        self.queries = _new(torch.mul, self.factor.view(*self.lead, *self.blocks[1:]), self.q_b).view(self.blocks)  # Qb = q E
        if self.smallest:  # keys relative to their block's end: k_{2a} exp(g_{2a+1}), k_{2a+1}
            if compiling():
                self.keys = torch.stack([self.k_b[..., 0, :].reshape(self.step.shape) * self.step, self.k_b[..., 1, :].reshape(self.step.shape)], dim=-2)
            else:
                self.keys = torch.empty(self.blocks, dtype=self.factor.dtype, device=self.factor.device)
                keys = self.keys.view(*self.lead, *self.blocks[1:])
                torch.mul(self.k_b[..., 0, :], self.step.view(keys[..., 0, :].shape), out=keys[..., 0, :])
                keys[..., 1, :].copy_(self.k_b[..., 1, :])
        else:  # keys relative to their block's start, k / E <= e^R |k| (the diagonal's)
            self.keys = _new(torch.div, self.k_b, self.factor.view(*self.lead, *self.blocks[1:])).view(self.blocks)

        # With a reach R < C, a level of size s > R keeps the R tokens on each side of its split (the rest
        # cross a whole R-block: below e^-state_flush), and the state only the chunk's first R queries and
        # last R keys. Between blocks, each side's factor is one tensor: rows q E exp(A), columns k exp(T - p) exp(Z).
        reach = plan.reach or chunk
        self.levels = []  # (size, rows, cols, row factor, column factor), smallest first
        for size, before, after, *last in _products(decay, chunk, block, floor):
            if last:
                break
            halves = (flat, chunk // (2 * size), 2, size // block, key_dim)
            used = min(size, reach) // block  # the blocks of each half next to the split
            right, left = (slice(None), slice(None), 1, slice(None, used)), (slice(None), slice(None), 0, slice(size // block - used, None))
            if self.smallest and size == block:  # E and the ends are already 0 or >= the floor: Qb and the keys as they are
                row_factor, col_factor = self._halves(self.factor, size)[right], self._halves(self.ends, size)[left]
                rows, cols = self._halves(self.queries, size)[right], self._halves(self.keys, size)[left]
            else:
                row_factor = self._factor(self._halves(self.factor, size)[right], before.view(halves)[right], floor)
                col_factor = self._factor(self._halves(self.ends, size)[left], after.view(halves)[left], floor)
                rows = self._scaled(self.q_b, row_factor, size, right)
                cols = self._scaled(self.k_b, col_factor, size, left)
            if self._span(size, used * block) != used * block:  # stacked: the views of every other block are copied
                rows, cols = rows.contiguous(), cols.contiguous()
            self.levels.append((size, rows, cols, row_factor, col_factor))

        # The state: entry factor E exp(P) (P: the blocks before in the chunk), exit factor exp(T - p) times the
        # decays of the blocks after, the chunk's decay exp(B); each 0 below the floor.
        total, ends = last[0], reach // block
        self.before = self._factor(self.factor[:, :ends], before[:, :ends], floor)  # [M, R/h, h, K]: q exp(b) = q times this
        self.exit_scale = self._factor(self.ends[:, -ends:], after[:, -ends:], floor)  # k exp(B - b) = k times this
        self.queries_entry = _new(torch.mul, self.q_b[..., :ends, :, :], self.before.view(*self.lead, ends, block, key_dim)).view(*self.lead, reach, key_dim)
        self.keys_exit = _new(torch.mul, self.k_b[..., -ends:, :, :], self.exit_scale.view(*self.lead, ends, block, key_dim)).view(*self.lead, reach, key_dim)
        self.chunk_decay = total.view(*self.lead, key_dim, 1)  # 0 below the floor (the products' threshold)
        self.scores = self._assemble()

    def _halves(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """[M, C/h, h, K] -> a view [M, C/2s, 2, s/h, h, K]: each 2s-block's two halves."""
        flat, blocks, block, key_dim = x.shape
        return x.view(flat, blocks * block // (2 * size), 2, size // block, block, key_dim)

    @staticmethod
    def _factor(per_token: torch.Tensor, per_block: torch.Tensor, floor: float) -> torch.Tensor:
        """per_token [M, n, h, K] (E or the ends: >= e^-60 or 0) times per_block [M, n, K] (0 or >= floor): a
        product >= e^-80, normal, in a new tensor; then 0 below floor."""
        return F.threshold_(_new(torch.mul, per_token, per_block.unsqueeze(-2)), floor, 0.0)

    def _scaled(self, x_b: torch.Tensor, factor: torch.Tensor, size: int, index) -> torch.Tensor:
        """q or k ([B, H, N, C/h, h, K] view) on one half of each 2s-block times that half's factor
        [M, C/2s, used, h, K]: a new [M, C/2s, used, h, K] tensor."""
        block = self.plan.block
        view = x_b.unflatten(3, (-1, 2, size // block))[(slice(None),) * 3 + index[1:]]
        return _new(torch.mul, view, factor.view(*self.lead, *factor.shape[1:])).view(factor.shape)

    def _assemble(self) -> torch.Tensor:
        chunk, block = self.plan.chunk, self.plan.block
        flat, key_dim = self.blocks[0], self.blocks[-1]
        scores = self.queries.new_zeros(flat, chunk, chunk)
        if self.smallest:
            # q_i . k_i on the diagonal, q_{2a+1} . (k_{2a} exp(g_{2a+1})) below it
            scores.diagonal(dim1=-2, dim2=-1).copy_(_dot(self.q_b, self.k_b).view(flat, chunk).mul_(self.scale))
            below = scores.view(flat, chunk // 2, 2, chunk // 2, 2).diagonal(dim1=1, dim2=3)[:, 1, 0]  # [M, C/2]
            below.copy_(_dot(self.q_b[..., 1, :], self.keys.view(*self.lead, *self.blocks[1:])[..., 0, :]).view(flat, -1).mul_(self.scale))
        else:
            diagonal = bmm(self.queries.view(-1, block, key_dim), self.keys.view(-1, block, key_dim).transpose(-1, -2), alpha=self.scale).tril_()
            _block_view(scores, block, diagonal=True).copy_(diagonal.view(flat, -1, block, block))
        for size, rows, cols, _, _ in self.levels:
            width = _width(rows)
            span = self._span(size, width)
            products = bmm(rows.reshape(-1, span, key_dim), cols.reshape(-1, span, key_dim).transpose(-1, -2), alpha=self.scale)
            _level_view(scores, size, width).unflatten(1, (-1, span // width)).copy_(_stacked(products, width).unflatten(0, (flat, -1)))
        return scores.view(*self.lead, chunk, chunk)

    def _span(self, size: int, width: int) -> int:
        """Rows per product of a level (width rows on each side of every split): small levels' pairs are stacked
        up to STACK rows into one product (its diagonal blocks are the pairs' products): a batched 2 x 2 matmul
        costs more than a 16 x 16 here."""
        return max(width, min(STACK, self.plan.chunk // (2 * size) * width))

    def query_key_grads(self, grad_scores, entry, exit_, scale):
        """(grad_q, grad_k) [B, H, N, C, K] from grad_scores [B, H, N, C, C] (do v^T, lower triangle) and the
        parts through the states, entry = scale do S_entry^T of the first R rows and exit_ = v dS_exit^T of the
        last R rows [B, H, N, R, K]: the diagonal blocks' part, then each level's and the state's part times
        its factor (q's and k's own units throughout)."""
        chunk, block = self.plan.chunk, self.plan.block
        flat, key_dim = self.blocks[0], self.blocks[-1]
        grads = grad_scores.reshape(flat, chunk, chunk)
        if self.smallest:  # the row-wise products: the diagonal in q's and k's units, below it through the keys
            diagonal = grads.diagonal(dim1=-2, dim2=-1).reshape(*self.lead, *self.blocks[1:3], 1) * scale
            below = grads.view(flat, chunk // 2, 2, chunk // 2, 2).diagonal(dim1=1, dim2=3)[:, 1, 0].reshape(*self.blocks[:2], 1) * scale
            grad_q = torch.zeros(self.blocks, dtype=grads.dtype, device=grads.device)
            grad_k = torch.zeros_like(grad_q)
            first_keys = grad_k.view(*self.lead, *self.blocks[1:])[..., 0, :]
            first_keys.addcmul_(below.view(*self.lead, -1, 1), self.q_b[..., 1, :]).mul_(self.step.view(first_keys.shape))
            grad_q.view(*self.lead, *self.blocks[1:])[..., 1, :].addcmul_(below.view(*self.lead, -1, 1), self.keys.view(*self.lead, *self.blocks[1:])[..., 0, :])
            grad_q.view(*self.lead, *self.blocks[1:]).addcmul_(diagonal, self.k_b)
            grad_k.view(*self.lead, *self.blocks[1:]).addcmul_(diagonal, self.q_b)
        else:  # in Qb's and the keys' units, then times E and over E
            on_diagonal = _block_view(grads, block, diagonal=True).reshape(-1, block, block)
            grad_q = bmm(on_diagonal, self.keys.view(-1, block, key_dim), alpha=scale).view(self.blocks).mul_(self.factor)
            grad_k = bmm(on_diagonal.transpose(-1, -2), self.queries.view(-1, block, key_dim), alpha=scale).view(self.blocks).div_(self.factor)
        for size, rows, cols, row_factor, col_factor in self.levels:
            width = _width(rows)
            span = self._span(size, width)
            level = _level_view(grads, size, width)  # [M, C/2s, w, w]
            if span == width:
                level = level.reshape(-1, width, width)
            else:  # the pairs' gradients on the diagonal of one product per `span` rows
                stacked = grads.new_zeros(flat * chunk // (2 * size) * width // span, span, span)
                _stacked(stacked, width).copy_(level.unflatten(1, (-1, span // width)).flatten(0, 1))
                level = stacked
            grad_rows = bmm(level, cols.reshape(-1, span, key_dim), alpha=scale).view(cols.shape)
            grad_cols = bmm(level.transpose(-1, -2), rows.reshape(-1, span, key_dim), alpha=scale).view(cols.shape)
            used = width // block
            self._halves(grad_q, size)[:, :, 1, :used].addcmul_(grad_rows, row_factor)
            self._halves(grad_k, size)[:, :, 0, size // block - used :].addcmul_(grad_cols, col_factor)
        # through the exit keys (k times the exit factor) and the entry queries (q times the entry factor)
        exit_, entry = exit_.reshape(flat, -1, block, key_dim), entry.reshape(flat, -1, block, key_dim)  # [M, R/h, h, K]
        grad_k[:, -exit_.shape[1] :].addcmul_(exit_, self.exit_scale)
        grad_q[:, : entry.shape[1]].addcmul_(entry, self.before)
        full = (*self.lead, chunk, key_dim)
        return grad_q.reshape(full), grad_k.reshape(full)
