"""The native GLA's tensor-parallel plan (applied, with FSDP2, by assay.models.parallel).

Megatron's layout, heads split across ranks: wq/wk/wv/wg, the forget gate's up-projection gk_up (weight
and bias) and the MLP's w1/w3 split by output columns; wo and w2 by input rows; one all-reduce after the
attention and one after the MLP. Each rank holds n_heads / tp heads and runs the GLA recurrence on them
alone: heads never exchange state. The low-rank gk_down stays replicated (its output feeds every rank's
gk_up; the column-parallel input sums its gradient over ranks). The per-head out_norm is a per-head norm
over the head-sharded output. Embedding, norms and output head stay replicated.
"""

from __future__ import annotations

from torch import nn

from assay.core.errors import AssayError
from assay.models.common.tp_plan import TP, attention_plan, check_tp_sizes, mlp_plan
from assay.models.gla.args import GLAArgs


def tp_plan(block: nn.Module, args: GLAArgs) -> dict[str, TP]:
    plan = attention_plan() | mlp_plan() | {"attention.gk_up": TP.COLWISE, "attention.out_norm": TP.HEAD_NORM}
    if args.use_output_gate:
        plan["attention.wg"] = TP.COLWISE
    return plan


def tp_sizes(args: GLAArgs) -> dict[str, int]:
    if args.use_short_conv:
        # Its per-channel filters would have to be split with the q, k, v columns: not written yet.
        raise AssayError("tensor parallelism of a GLA with short convolutions (use_short_conv) is not implemented; use FSDP (--dp-shard)")
    return {"n_heads": args.n_heads, "hidden_dim": args.hidden_dim}


def check_tp_divisible(args: GLAArgs, tp_size: int) -> None:
    if tp_size > 1:
        check_tp_sizes(tp_sizes(args), tp_size)


def parallelize_gla(model: nn.Module, mesh, tp: bool, dp_shard: bool, **fsdp) -> nn.Module:
    """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard); in place. Training and
    prefill only: decode_step calls blocks' step(), which FSDP's forward hooks do not see."""
    from assay.models.parallel import parallelize_model

    return parallelize_model(model, mesh, tp, dp_shard, tp_plan, tp_sizes, **fsdp)


__all__ = ["check_tp_divisible", "parallelize_gla", "tp_plan", "tp_sizes"]
