"""Tensor parallelism and FSDP2 for the native GLA, applied from outside the model (as for Qwen3).

TP over the mesh dim "tp" (Megatron layout, heads split across ranks): wq/wk/wv/wg, the forget gate's
up-projection gk_up (weight and bias) and the MLP's w1/w3 split by output columns; wo and w2 by input
rows; one all-reduce after the attention and one after the MLP. Each rank holds n_heads / tp heads
and runs the GLA recurrence on them alone: heads never exchange state. The low-rank gk_down stays
replicated (its output feeds every rank's gk_up; the column-parallel input sums its gradient over
ranks). The per-head out_norm weight becomes a replicated DTensor over the head-sharded output, so its
gradient is summed over all heads, not one rank's. Embedding, norms and output head stay replicated.

FSDP2 over the mesh dim "dp_shard": one fully_shard unit per block, then the root.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from assay.core.errors import AssayError
from assay.models.gla.args import GLAArgs
from assay.models.gla.model import GLA
from assay.models.parallel import apply_fsdp, check_tp_sizes, parallelize_model


def check_tp_divisible(args: GLAArgs, tp_size: int) -> None:
    if args.use_short_conv and tp_size > 1:
        # Its per-channel filters would have to be split with the q, k, v columns: not written yet.
        raise AssayError("tensor parallelism of a GLA with short convolutions (use_short_conv) is not implemented; use FSDP (--dp-shard)")
    sizes = {"n_heads": args.n_heads, "hidden_dim": args.hidden_dim}
    check_tp_sizes(sizes, tp_size)


def apply_tp(model: GLA, tp_mesh: DeviceMesh) -> None:
    check_tp_divisible(model.args, tp_mesh.size())
    for block in model.layers:
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.gk_up": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            # out_norm's input is [B, T, local heads, head_v_dim]: sharded on dim 2.
            "attention.out_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
            "mlp.w1": ColwiseParallel(),
            "mlp.w3": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(),
        }
        if block.attention.wg is not None:
            plan["attention.wg"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)


def parallelize_gla(
    model: GLA,
    mesh: DeviceMesh,
    tp: bool,
    dp_shard: bool,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> GLA:
    """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard). In place; returns the model.

    Load weights before calling (every rank the same): TP wraps the existing parameters as DTensors.
    Training and prefill only: decode_step calls blocks' step(), which FSDP's forward hooks do not see.
    """
    return parallelize_model(model, mesh, tp, dp_shard, apply_tp, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)


# apply_fsdp lives in assay.models.parallel; callers still import it from here.
__all__ = ["apply_fsdp", "apply_tp", "check_tp_divisible", "parallelize_gla"]
