"""Tensor parallelism and FSDP2 for the native Llama, applied from outside the model (as for Qwen3).

TP over the mesh dim "tp" (Megatron layout): wq/wk/wv and w1/w3 split by output columns (their biases
with them), wo and w2 by input rows (a row-parallel bias is added once, after the all-reduce), so each
block needs one all-reduce after attention and one after the MLP. Each rank holds n_heads / tp query
heads and n_kv_heads / tp key/value heads. Embedding, norms and output head stay replicated.

FSDP2 over the mesh dim "dp_shard": one fully_shard unit per block, then the root.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from assay.models.llama.args import LlamaArgs
from assay.models.llama.model import Llama
from assay.models.parallel import check_tp_sizes, parallelize_model


def check_tp_divisible(args: LlamaArgs, tp_size: int) -> None:
    check_tp_sizes({"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "hidden_dim": args.hidden_dim}, tp_size)


def apply_tp(model: Llama, tp_mesh: DeviceMesh) -> None:
    check_tp_divisible(model.args, tp_mesh.size())
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "mlp.w1": ColwiseParallel(),
        "mlp.w3": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(),
    }
    for block in model.layers:
        parallelize_module(block, tp_mesh, plan)


def parallelize_llama(
    model: Llama,
    mesh: DeviceMesh,
    tp: bool,
    dp_shard: bool,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> Llama:
    """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard). In place; returns the model.

    Load weights before calling (every rank the same): TP wraps the existing parameters as DTensors.
    """
    return parallelize_model(model, mesh, tp, dp_shard, apply_tp, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)


__all__ = ["apply_tp", "check_tp_divisible", "parallelize_llama"]
