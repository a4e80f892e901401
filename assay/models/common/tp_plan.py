"""Tensor-parallel plans as data: module name (inside a block) -> how it is split. Each architecture's
parallelize.py declares its plan from these pieces; assay.models.parallel turns it into torch's
ParallelStyles on use (so declaring a plan imports no torch.distributed).

Megatron's layout: q/k/v and the MLP's gate/up projections split by output columns (their biases with
them), the output projections by input rows, so each block needs one all-reduce after attention and one
after the MLP; each rank holds n_heads / tp query heads and n_kv_heads / tp key/value heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from assay.core.errors import AssayError


class TP(Enum):
    COLWISE = "colwise"  # split by output columns: ColwiseParallel
    ROWWISE = "rowwise"  # split by input rows, all-reduce after: RowwiseParallel
    # A per-head norm over head-sharded activations [B, T, local heads, D]: its weight a replicated DTensor,
    # its gradient summed over all heads (all ranks), not one rank's.
    HEAD_NORM = "head_norm"


def attention_plan(qk_norm: bool = False, prefix: str = "attention") -> dict[str, TP]:
    plan = {f"{prefix}.wq": TP.COLWISE, f"{prefix}.wk": TP.COLWISE, f"{prefix}.wv": TP.COLWISE, f"{prefix}.wo": TP.ROWWISE}
    if qk_norm:
        plan.update({f"{prefix}.q_norm": TP.HEAD_NORM, f"{prefix}.k_norm": TP.HEAD_NORM})
    return plan


def mlp_plan(prefix: str = "mlp") -> dict[str, TP]:
    return {f"{prefix}.w1": TP.COLWISE, f"{prefix}.w3": TP.COLWISE, f"{prefix}.w2": TP.ROWWISE}


def check_tp_sizes(sizes: Mapping[str, int], tp_size: int) -> None:
    """AssayError naming every size that the tensor parallel degree does not divide."""
    indivisible = [f"{name}={value}" for name, value in sizes.items() if value % tp_size]
    if indivisible:
        raise AssayError(f"tensor parallel degree {tp_size} does not divide {', '.join(indivisible)}")
