"""Tensor parallelism and FSDP2 for the native Qwen3, applied from outside the model.

TP over the mesh dim "tp" (Megatron layout): wq/wk/wv and w1/w3 split by output columns, wo and w2
by input rows, so each block needs one all-reduce after attention and one after the MLP. Each rank
then holds n_heads / tp query heads and n_kv_heads / tp key/value heads; Attention infers its local
head count from the projected width. q_norm/k_norm weights become replicated DTensors over the
head-sharded activations, so their gradient is summed over all heads (all ranks), not one rank's.
MoE layers stay replicated under TP (each TP rank runs the whole MoE on the same tokens): correct,
and the place expert parallelism or sharded experts would go later. Embedding, final norm and
output head stay replicated too.

FSDP2 over the mesh dim "dp_shard": one fully_shard unit per block, then the root (embedding, norm,
output head; a tied embedding/output weight is one parameter in the root unit).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from assay.core.errors import AssayError
from assay.models.qwen3.model import Qwen3


def _check_tp_divisible(model: Qwen3, tp_size: int) -> None:
    args = model.args
    sizes = {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads}
    if any(not block.is_moe for block in model.layers):
        sizes["hidden_dim"] = args.hidden_dim
    indivisible = [f"{name}={value}" for name, value in sizes.items() if value % tp_size]
    if indivisible:
        raise AssayError(f"tensor parallel degree {tp_size} does not divide {', '.join(indivisible)}")


def apply_tp(model: Qwen3, tp_mesh: DeviceMesh) -> None:
    _check_tp_divisible(model, tp_mesh.size())
    for block in model.layers:
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
        }
        if model.args.qk_norm:
            # The activations entering q_norm/k_norm are [B, T, local heads, head_dim]: sharded on dim 2.
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if not block.is_moe:
            plan.update({"mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(), "mlp.w2": RowwiseParallel()})
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(model: Qwen3, dp_mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None, reshard_after_forward: bool = True) -> None:
    policy = mp_policy or MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root unit is gathered for the output head right after the last block: no point resharding it.
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)


def parallelize_qwen3(
    model: Qwen3,
    mesh: DeviceMesh,
    tp: bool,
    dp_shard: bool,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> Qwen3:
    """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard). In place; returns the model.

    Load weights before calling (every rank the same): TP wraps the existing parameters as DTensors.
    """
    names = mesh.mesh_dim_names or ()
    for wanted, dim_name in ((tp, "tp"), (dp_shard, "dp_shard")):
        if wanted and dim_name not in names:
            raise AssayError(f"the device mesh has dims {names}; parallelizing needs one named {dim_name!r}")
    if tp:
        apply_tp(model, mesh["tp"])
    if dp_shard:
        apply_fsdp(model, mesh["dp_shard"], mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model
