"""Newton-Schulz on FSDP2-sharded matrices: whole matrices to their owner ranks and back, by all-to-all.

Muon orthogonalises each weight matrix's update, which needs the whole matrix, while FSDP2 leaves
each rank a block of rows (Shard(0)). Two exchanges hand every matrix to one owner rank:

  1. all-to-all: each rank sends its rows of matrix m to owner(m);
     the owner concatenates the rows and runs Newton-Schulz on the whole matrix;
  2. all-to-all: the owner sends each rank its rows of the result.

Owners are assigned so that Newton-Schulz work is balanced: the ranks orthogonalise different
matrices in parallel instead of every rank orthogonalising every matrix.

The naive way, all-gathering every matrix on every rank, moves (world - 1) / world of all the
matrices to each rank; the two exchanges move about 2 (world - 1) / world**2 of them, so the
saving in bytes grows as world / 2 (none at 2 ranks, 2x at 4, 24x at 48). Both are counted on
every step (CommStats) so the saving is measured, not assumed.

Rows travel in bfloat16: Newton-Schulz's first operation rounds its input to bfloat16 and its result
is bfloat16, so sending bfloat16 both ways gives bit-identical results to a single process.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from assay.core.errors import AssayError

WIRE_DTYPE = torch.bfloat16
EXCHANGES = ("all_to_all", "all_gather")


@dataclass
class CommStats:
    """Bytes this rank moved for Muon (cumulative over steps), next to what the naive way would move.

    sent_bytes / received_bytes: bytes of the exchange that ran, to and from other ranks (a rank's own
    rows never leave it and are not counted); naive_*: an all-gather of every matrix to every rank,
    in the same wire dtype. newton_schulz_matrices: whole matrices this rank orthogonalised.
    """

    exchange: str = "all_to_all"
    steps: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    naive_sent_bytes: int = 0
    naive_received_bytes: int = 0
    newton_schulz_matrices: int = 0
    exchange_s: float = 0.0
    newton_schulz_s: float = 0.0
    last_step: dict = field(default_factory=dict)

    def add_step(self, step: dict) -> None:
        self.steps += 1
        for key in ("sent_bytes", "received_bytes", "naive_sent_bytes", "naive_received_bytes", "newton_schulz_matrices", "exchange_s", "newton_schulz_s"):
            setattr(self, key, getattr(self, key) + step[key])
        self.last_step = step

    @property
    def saving(self) -> float | None:
        """Naive bytes received over bytes received: how many times less this rank took in."""
        return self.naive_received_bytes / self.received_bytes if self.received_bytes else None

    def as_dict(self) -> dict:
        record = asdict(self)
        record["saving"] = self.saving
        return record


@dataclass(frozen=True)
class NewtonSchulz:
    """One matrix's orthogonalisation settings (they may differ between parameter groups)."""

    coefficients: tuple[float, float, float]
    steps: int
    eps: float


def fsdp_rows(rows: int, world: int) -> list[int]:
    """Rows each rank holds under FSDP2's Shard(0): torch.chunk's rule, ceil(rows / world) per rank, the last ones short or empty."""
    per_rank = -(-rows // world)
    return [max(0, min(per_rank, rows - rank * per_rank)) for rank in range(world)]


def assign_owners(shapes: Sequence[tuple[int, int]], world: int) -> list[int]:
    """Owner rank per matrix: largest Newton-Schulz cost first, each to the least-loaded rank.

    Cost ~ rows * cols * min(rows, cols), the Gram matrix products that dominate an iteration.
    Deterministic, so every rank computes the same plan without talking.
    """
    loads = [0] * world
    owners = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: (-shapes[i][0] * shapes[i][1] * min(shapes[i]), i))
    for index in order:
        rank = min(range(world), key=lambda r: (loads[r], r))
        owners[index] = rank
        loads[rank] += shapes[index][0] * shapes[index][1] * min(shapes[index])
    return owners


def _all_to_all(parts_per_rank: list[list[torch.Tensor]], receive_sizes: list[int], group, like: torch.Tensor) -> torch.Tensor:
    """One all_to_all_single: parts_per_rank[r] go to rank r; returns the flat buffer received, by source rank."""
    send_sizes = [sum(part.numel() for part in parts) for parts in parts_per_rank]
    flat_parts = [part.reshape(-1) for parts in parts_per_rank for part in parts]
    send = torch.cat(flat_parts) if flat_parts else like.new_empty(0, dtype=WIRE_DTYPE)
    received = like.new_empty(sum(receive_sizes), dtype=WIRE_DTYPE)
    dist.all_to_all_single(received, send, output_split_sizes=receive_sizes, input_split_sizes=send_sizes, group=group)
    return received


def _off_rank(sizes: list[int], rank: int) -> int:
    return sum(size for r, size in enumerate(sizes) if r != rank) * WIRE_DTYPE.itemsize


def orthogonalize_sharded(
    updates: Sequence[torch.Tensor],
    shapes: Sequence[tuple[int, int]],
    settings: Sequence[NewtonSchulz],
    orthogonalize: Callable[[torch.Tensor, NewtonSchulz], torch.Tensor],
    group,
    exchange: str,
    stats: CommStats,
) -> list[torch.Tensor]:
    """This rank's rows of orthogonalize(whole matrix) for each matrix, from this rank's rows of each update.

    updates[i]: this rank's rows of matrix i ([fsdp_rows(...)[rank], cols]); shapes[i]: the whole matrix's.
    Every rank of `group` must call this with the same matrices in the same order.
    """
    if exchange not in EXCHANGES:
        raise AssayError(f"Muon exchange must be one of {', '.join(EXCHANGES)}; got {exchange!r}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    rows = [fsdp_rows(shape[0], world) for shape in shapes]
    for index, (update, shape) in enumerate(zip(updates, shapes)):
        if tuple(update.shape) != (rows[index][rank], shape[1]):
            raise AssayError(
                f"Muon: rank {rank} holds {tuple(update.shape)} of a {tuple(shape)} matrix; FSDP2 Shard(0) would give "
                f"{(rows[index][rank], shape[1])} (parameters must be sharded by fully_shard on dim 0)"
            )
    if not updates:
        return []
    like = updates[0]
    local_rows = [update.to(WIRE_DTYPE) for update in updates]
    cols = [shape[1] for shape in shapes]
    step = {
        "sent_bytes": 0,
        "received_bytes": 0,
        "naive_sent_bytes": sum(update.numel() for update in updates) * (world - 1) * WIRE_DTYPE.itemsize,
        "naive_received_bytes": sum(shape[0] * shape[1] - update.numel() for shape, update in zip(shapes, updates)) * WIRE_DTYPE.itemsize,
        "newton_schulz_matrices": 0,
        "exchange_s": 0.0,
        "newton_schulz_s": 0.0,
    }

    def exchange_timed(parts_per_rank, receive_sizes):
        start = time.perf_counter()
        received = _all_to_all(parts_per_rank, receive_sizes, group, like)
        step["exchange_s"] += time.perf_counter() - start
        step["sent_bytes"] += _off_rank([sum(p.numel() for p in parts) for parts in parts_per_rank], rank)
        step["received_bytes"] += _off_rank(receive_sizes, rank)
        return received

    def assemble(received: torch.Tensor, matrices: list[int]) -> list[torch.Tensor]:
        """Whole matrices from a buffer holding, per source rank, that rank's rows of each of `matrices`."""
        sizes_by_source = [sum(rows[i][source] * cols[i] for i in matrices) for source in range(world)]
        row_blocks: list[list[torch.Tensor]] = [[] for _ in matrices]
        for source, block in enumerate(received.split(sizes_by_source)):
            for slot, (i, piece) in enumerate(zip(matrices, block.split([rows[i][source] * cols[i] for i in matrices]))):
                row_blocks[slot].append(piece.view(rows[i][source], cols[i]))
        return [torch.cat(blocks) for blocks in row_blocks]

    def run_newton_schulz(matrices: list[int], whole: list[torch.Tensor]) -> list[torch.Tensor]:
        start = time.perf_counter()
        results = [orthogonalize(matrix, settings[i]) for i, matrix in zip(matrices, whole)]
        step["newton_schulz_s"] += time.perf_counter() - start
        step["newton_schulz_matrices"] += len(matrices)
        return results

    if exchange == "all_gather":
        # Every rank receives every matrix and orthogonalises all of them (gloo's all_gather needs equal
        # sizes, so this uneven all-gather is one all_to_all_single sending the same rows to every rank).
        everything = list(range(len(updates)))
        receive_sizes = [sum(rows[i][source] * cols[i] for i in everything) for source in range(world)]
        received = exchange_timed([local_rows] * world, receive_sizes)
        orthogonal = run_newton_schulz(everything, assemble(received, everything))
        result = [matrix.split(rows[i])[rank] for i, matrix in zip(everything, orthogonal)]
    else:
        owners = assign_owners(shapes, world)
        owned_by = [[i for i in range(len(shapes)) if owners[i] == r] for r in range(world)]
        mine = owned_by[rank]
        # Exchange 1: my rows of every matrix to its owner.
        to_owners = [[local_rows[i] for i in owned_by[r]] for r in range(world)]
        received = exchange_timed(to_owners, [sum(rows[i][source] * cols[i] for i in mine) for source in range(world)])
        orthogonal = run_newton_schulz(mine, assemble(received, mine))
        # Exchange 2: each rank's rows of the matrices I own, back to it.
        to_holders = [[matrix.split(rows[i])[r] for i, matrix in zip(mine, orthogonal)] for r in range(world)]
        returned = exchange_timed(to_holders, [sum(rows[i][rank] * cols[i] for i in owned_by[r]) for r in range(world)])
        by_owner = returned.split([sum(rows[i][rank] * cols[i] for i in owned_by[r]) for r in range(world)])
        result = [None] * len(shapes)
        for owner, block in enumerate(by_owner):
            for i, piece in zip(owned_by[owner], block.split([rows[i][rank] * cols[i] for i in owned_by[owner]])):
                result[i] = piece.view(rows[i][rank], cols[i])
    stats.exchange = exchange
    stats.add_step(step)
    return result
