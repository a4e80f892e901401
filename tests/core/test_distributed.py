"""run_on_ranks: real gloo ranks in child processes, results in rank order, failures reported, no leftovers."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from assay.core.distributed import RankError, run_on_ranks


def _sum_of_ranks() -> tuple[int, int, int]:
    import torch
    import torch.distributed as dist

    total = torch.tensor([dist.get_rank()])
    dist.all_reduce(total)
    return dist.get_rank(), dist.get_world_size(), int(total)


def _rank_one_raises() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()  # rank 0 waits for a peer that never comes: it must be killed, not waited for


def _rank_one_dies() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


@pytest.mark.distributed
def test_results_come_back_in_rank_order():
    assert run_on_ranks(_sum_of_ranks, world_size=2) == [(0, 2, 1), (1, 2, 1)]


@pytest.mark.distributed
def test_rank_exception_is_reported_and_every_rank_ends():
    with pytest.raises(RankError, match="boom on rank 1"):
        run_on_ranks(_rank_one_raises, world_size=2, timeout_s=120)
    assert multiprocessing.active_children() == []


@pytest.mark.distributed
def test_rank_that_dies_without_reporting_is_an_error():
    with pytest.raises(RankError, match="exited with code 3"):
        run_on_ranks(_rank_one_dies, world_size=2, timeout_s=120)
    assert multiprocessing.active_children() == []
