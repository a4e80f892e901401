"""Tensor parallelism and FSDP2 for every native model, applied from outside the model: an architecture's
TP plan (assay.models.common.tp_plan: module name -> TP) turned into torch's ParallelStyles per block, then
FSDP2 with one unit per block. Imported on use: torch.distributed only for a run that shards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from assay.core.errors import AssayError
from assay.models.common.tp_plan import TP, check_tp_sizes

TPPlan = Callable[[nn.Module, Any], Mapping[str, TP]]  # (block, args) -> module name -> TP

_STYLES = {
    TP.COLWISE: ColwiseParallel,
    TP.ROWWISE: RowwiseParallel,
    # The activations entering a per-head norm are [B, T, local heads, head_dim]: sharded on dim 2.
    TP.HEAD_NORM: lambda: SequenceParallel(sequence_dim=2, use_local_output=True),
}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: TPPlan) -> None:
    """Each block of model.layers split by plan(block, model.args)."""
    for block in model.layers:
        parallelize_module(block, tp_mesh, {name: _STYLES[style]() for name, style in plan(block, model.args).items()})


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None, reshard_after_forward: bool = True) -> None:
    """One fully_shard unit per block of model.layers, then the root (embedding, norm, output head)."""
    policy = mp_policy or MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root unit is gathered for the output head right after the last block: no point resharding it.
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)


def parallelize_model(
    model: nn.Module,
    mesh: DeviceMesh,
    tp: bool,
    dp_shard: bool,
    plan: TPPlan,
    tp_sizes: Callable[[Any], Mapping[str, int]] | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """The TP plan over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard). In place; returns the model.

    Load weights before calling (every rank the same): TP wraps the existing parameters as DTensors.
    """
    names = mesh.mesh_dim_names or ()
    for wanted, dim_name in ((tp, "tp"), (dp_shard, "dp_shard")):
        if wanted and dim_name not in names:
            raise AssayError(f"the device mesh has dims {names}; parallelizing needs one named {dim_name!r}")
    if tp:
        if tp_sizes is not None and mesh["tp"].size() > 1:
            check_tp_sizes(tp_sizes(model.args), mesh["tp"].size())
        apply_tp(model, mesh["tp"], plan)
    if dp_shard:
        apply_fsdp(model, mesh["dp_shard"], mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model
