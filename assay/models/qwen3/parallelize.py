"""The native Qwen3's tensor-parallel plan (applied, with FSDP2, by assay.models.parallel): Megatron's
layout on attention and the dense MLP; q_norm/k_norm as per-head norms over head-sharded activations
(replicated weights, gradient summed over all heads). MoE layers stay replicated under TP (each TP rank
runs the whole MoE on the same tokens): correct, and the place expert parallelism would go later.
Embedding, final norm and output head stay replicated too.
"""

from __future__ import annotations

from torch import nn

from assay.models.common.tp_plan import TP, attention_plan, mlp_plan
from assay.models.qwen3.args import Qwen3Args


def tp_plan(block: nn.Module, args: Qwen3Args) -> dict[str, TP]:
    plan = attention_plan(qk_norm=args.qk_norm)
    return plan if args.is_moe_layer(block.layer_id) else plan | mlp_plan()


def tp_sizes(args: Qwen3Args) -> dict[str, int]:
    sizes = {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads}
    if any(not args.is_moe_layer(layer_id) for layer_id in range(args.n_layers)):
        sizes["hidden_dim"] = args.hidden_dim
    return sizes
