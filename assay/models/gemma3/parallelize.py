"""The native Gemma 3's tensor-parallel plan (applied, with FSDP2, by assay.models.parallel): Megatron's
layout on attention and the GeGLU MLP, q_norm/k_norm as per-head norms over head-sharded activations.
The sandwich norms, embedding, final norm and output head stay replicated.
"""

from __future__ import annotations

from torch import nn

from assay.models.common.tp_plan import TP, attention_plan, mlp_plan
from assay.models.gemma3.args import Gemma3Args


def tp_plan(block: nn.Module, args: Gemma3Args) -> dict[str, TP]:
    return attention_plan(qk_norm=True) | mlp_plan()


def tp_sizes(args: Gemma3Args) -> dict[str, int]:
    return {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "hidden_dim": args.hidden_dim}
