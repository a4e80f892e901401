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
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from assay.models.parallel import apply_fsdp, check_tp_sizes, parallelize_model
from assay.models.qwen3.args import Qwen3Args
from assay.models.qwen3.model import Qwen3


def check_tp_divisible(args: Qwen3Args, tp_size: int) -> None:
    sizes = {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads}
    if any(not args.is_moe_layer(layer_id) for layer_id in range(args.n_layers)):
        sizes["hidden_dim"] = args.hidden_dim
    check_tp_sizes(sizes, tp_size)


def apply_tp(model: Qwen3, tp_mesh: DeviceMesh) -> None:
    check_tp_divisible(model.args, tp_mesh.size())
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
    return parallelize_model(model, mesh, tp, dp_shard, apply_tp, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)


# apply_fsdp lives in assay.models.parallel; callers still import it from here.
__all__ = ["apply_fsdp", "apply_tp", "check_tp_divisible", "parallelize_qwen3"]
