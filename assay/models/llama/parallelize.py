"""The native Llama's tensor-parallel plan (applied, with FSDP2, by assay.models.parallel): Megatron's
layout on attention and the MLP, their biases split with their columns (a row-parallel bias is added
once, after the all-reduce). Embedding, norms and output head stay replicated.
"""

from __future__ import annotations

from torch import nn

from assay.models.common.tp_plan import TP, attention_plan, mlp_plan
from assay.models.llama.args import LlamaArgs


def tp_plan(block: nn.Module, args: LlamaArgs) -> dict[str, TP]:
    return attention_plan() | mlp_plan()


def tp_sizes(args: LlamaArgs) -> dict[str, int]:
    return {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "hidden_dim": args.hidden_dim}
