"""What every native model's parallelize.py shares: FSDP2 wrapping, the TP divisibility check, and the
mesh check and order (TP, then FSDP). The per-model TP plans stay in each model's parallelize.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from assay.core.errors import AssayError


def check_tp_sizes(sizes: Mapping[str, int], tp_size: int) -> None:
    """AssayError naming every size that the tensor parallel degree does not divide."""
    indivisible = [f"{name}={value}" for name, value in sizes.items() if value % tp_size]
    if indivisible:
        raise AssayError(f"tensor parallel degree {tp_size} does not divide {', '.join(indivisible)}")


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
    apply_tp: Callable[[nn.Module, DeviceMesh], None],
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """apply_tp over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard). In place; returns the model."""
    names = mesh.mesh_dim_names or ()
    for wanted, dim_name in ((tp, "tp"), (dp_shard, "dp_shard")):
        if wanted and dim_name not in names:
            raise AssayError(f"the device mesh has dims {names}; parallelizing needs one named {dim_name!r}")
    if tp:
        apply_tp(model, mesh["tp"])
    if dp_shard:
        apply_fsdp(model, mesh["dp_shard"], mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model
