"""Where this process sits in a torchrun job: rank, the (dp_shard, tp) DeviceMesh, and the few
collectives the trainer needs (mean of a scalar, barrier).

One process (no torchrun) is a job of one rank with no process group and no mesh, so the trainer
runs the same code either way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from assay.core.device import device_module
from assay.core.errors import AssayError

MESH_DIMS = ("dp_shard", "tp")


@dataclass(frozen=True)
class Layout:
    world_size: int
    rank: int
    local_rank: int
    dp_shard: int
    tp: int
    mesh: object | None = None  # torch.distributed DeviceMesh with dims MESH_DIMS, None for one process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_rank(self) -> int:
        # Rank order of init_device_mesh: row-major over (dp_shard, tp), so tp neighbours are adjacent ranks.
        return self.rank // self.tp


def launched_world() -> tuple[int, int, int]:
    """(world_size, rank, local_rank) as torchrun sets them; (1, 0, 0) outside torchrun."""
    return int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


def plan_layout(dp_shard: int | None, tp: int, world_size: int) -> tuple[int, int]:
    """Check the requested degrees against the processes launched; dp_shard defaults to world / tp."""
    if tp < 1 or (dp_shard is not None and dp_shard < 1):
        raise AssayError(f"--tp and --dp-shard must be >= 1 (got tp={tp}, dp-shard={dp_shard})")
    if dp_shard is None:
        if world_size % tp:
            raise AssayError(f"--tp {tp} does not divide the {world_size} processes launched")
        dp_shard = world_size // tp
    if dp_shard * tp != world_size:
        launch = "" if world_size > 1 else f"; launch with torchrun --nproc-per-node {dp_shard * tp} -m assay train ..."
        raise AssayError(f"--dp-shard {dp_shard} x --tp {tp} needs {dp_shard * tp} processes, {world_size} launched{launch}")
    return dp_shard, tp


def place_device(device: torch.device, local_rank: int, world_size: int) -> torch.device:
    """One accelerator per local rank under torchrun (cuda -> cuda:LOCAL_RANK); CPU ranks share the host."""
    if device.type == "cpu" or world_size == 1 or device.index is not None:
        return device
    placed = torch.device(device.type, local_rank)
    set_device = getattr(device_module(device.type), "set_device", None)
    if set_device:
        set_device(placed)
    return placed


def setup(device: torch.device, dp_shard: int, tp: int) -> Layout:
    world_size, rank, local_rank = launched_world()
    if world_size == 1:
        return Layout(1, 0, 0, 1, 1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from assay.core.distributed import init_from_env

    backend = dist.Backend.default_device_backend_map.get(device.type)
    if backend is None:
        raise AssayError(f"torch.distributed has no default backend for device type {device.type!r}")
    # CPU collectives stay available on accelerators (gloo beside nccl): scalars read back to the host.
    init_from_env("gloo" if device.type == "cpu" else f"cpu:gloo,{device.type}:{backend}")
    mesh = init_device_mesh(device.type, (dp_shard, tp), mesh_dim_names=MESH_DIMS)
    return Layout(world_size, rank, local_rank, dp_shard, tp, mesh)


def teardown(layout: Layout) -> None:
    if layout.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def mean_over_ranks(value: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Mean of a scalar over every rank (tp ranks hold equal values, so this is the data-parallel mean)."""
    if not layout.distributed:
        return value
    import torch.distributed as dist

    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return total / layout.world_size


def barrier(layout: Layout) -> None:
    if layout.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj, layout: Layout):
    """Rank 0's object on every rank (a decision one rank makes for all, e.g. which checkpoint to resume)."""
    if not layout.distributed:
        return obj
    import torch.distributed as dist

    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
