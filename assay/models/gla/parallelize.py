"""The native GLA's tensor-parallel plan (applied, with FSDP2, by assay.models.parallel).

Megatron's layout, heads split across ranks: wq/wk/wv/wg, the forget gate's up-projection gk_up (weight
and bias) and the MLP's w1/w3 split by output columns; wo and w2 by input rows; one all-reduce after the
attention and one after the MLP. Each rank holds n_heads / tp heads and runs the GLA recurrence on them
alone: heads never exchange state. The low-rank gk_down stays replicated (its output feeds every rank's
gk_up; the column-parallel input sums its gradient over ranks). The per-head out_norm is a per-head norm
over the head-sharded output. With short convolutions, the q, k, v convolutions' depthwise filters (and
biases) are split on their channel dim with the projection columns they follow (TP.CHANNELWISE): each rank
convolves its own heads' channels, and no communication is added. Embedding, norms and output head stay
replicated.
"""

from __future__ import annotations

from torch import nn

from assay.models.common.tp_plan import TP, attention_plan, mlp_plan
from assay.models.gla.args import GLAArgs


def tp_plan(block: nn.Module, args: GLAArgs) -> dict[str, TP]:
    plan = attention_plan() | mlp_plan() | {"attention.gk_up": TP.COLWISE, "attention.out_norm": TP.HEAD_NORM}
    if args.use_output_gate:
        plan["attention.wg"] = TP.COLWISE
    if args.use_short_conv:
        plan |= {f"attention.{name}_conv": TP.CHANNELWISE for name in ("q", "k", "v")}
    return plan


def tp_sizes(args: GLAArgs) -> dict[str, int]:
    # Heads divisible: the q, k, v columns (and their convolutions' channels) then split by whole heads.
    return {"n_heads": args.n_heads, "hidden_dim": args.hidden_dim}


__all__ = ["tp_plan", "tp_sizes"]
