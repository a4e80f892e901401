"""Parameter counts for the MFU formula, on any native model (the meta device included)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from assay.models.common.decoder import SoftcappedOutput
from assay.models.common.feed_forward import GroupedExperts


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter once (a tied embedding/output counts once)
    embedding: int  # the token embedding table (a lookup, not a matmul)
    active_matmul: int  # matmul weights one token passes: attention, MLP or router + top_k experts, output head


def count_parameters(model: nn.Module, top_k: int | None = None) -> ParamCounts:
    """Parameter counts for the MFU formula (assay.core.metrics.train_flops_per_token takes active_matmul).

    Works on the meta device, so a 235B spec is counted without allocating it. top_k: experts each
    token passes (MoE models); None: the model's args.top_k (0 without experts).
    """
    if top_k is None:
        top_k = getattr(getattr(model, "args", None), "top_k", 0)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    embedding = model.tok_embeddings.weight.numel()
    active = 0
    for module in model.modules():
        if isinstance(module, (nn.Linear, SoftcappedOutput)):
            active += module.weight.numel()  # includes the output head even when tied to the embedding
        elif isinstance(module, GroupedExperts):
            per_expert = (module.w1.numel() + module.w2.numel() + module.w3.numel()) // module.n_experts
            active += per_expert * top_k
    return ParamCounts(total=total, embedding=embedding, active_matmul=active)
