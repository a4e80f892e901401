"""Model families the trainer knows, keyed by config.json's `model_type`.

The trainer never names an architecture: it asks this registry for the family of a checkpoint and
calls the family's functions (load, build from a flavour, count FLOPs, parallelize, export). A new
architecture (GLA, ...) adds one `register_family(ModelFamily(...))` call below, nothing in the
trainer. The `hf` path needs a family only for FLOP counting, and falls back to counting the
Transformers model's linear layers when the model_type is not registered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from assay.core.errors import AssayError


@dataclass(frozen=True)
class FlopShape:
    """What core.metrics.train_flops_per_token needs: active matmul weights per token, layers, attention width."""

    active_matmul_params: int
    n_layers: int
    attention_width: int


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_types: tuple[str, ...]
    # config.json dict -> the family's args (its spec dataclass)
    args_from_hf_config: Callable[[dict], Any]
    # (args, "layers=4,experts=8" or None) -> args with the overrides applied
    apply_spec: Callable[[Any, str | None], Any]
    # named sizes: {"tiny": args, ...}
    flavours: dict[str, Any]
    # (checkpoint dir, spec overrides, slice_experts, device, dtype) -> (model, args), weights loaded
    load: Callable[[os.PathLike, str | None, bool, torch.device, torch.dtype], tuple[nn.Module, Any]]
    # (args, device, dtype, seed) -> randomly initialised model
    build: Callable[[Any, torch.device, torch.dtype, int], nn.Module]
    # args -> FLOP shape (counted on the meta device, so a sharded model is counted whole)
    flop_shape: Callable[[Any], FlopShape]
    # model -> its transformer blocks (compiled one by one)
    blocks: Callable[[nn.Module], list[nn.Module]]
    # (args, tp) -> AssayError when the sizes do not split tp ways (before any process group exists)
    check_tp: Callable[[Any, int], None]
    # (model, mesh, tp, dp_shard) -> model, in place
    parallelize: Callable[[nn.Module, Any, bool, bool], nn.Module]
    # (full plain-tensor state dict, args, out_dir, tokenizer_source_dir) -> files written
    export_hf: Callable[[dict, Any, os.PathLike, os.PathLike | None], list]


FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> None:
    for model_type in family.model_types:
        FAMILIES[model_type] = family


def family_for(model_type: str | None) -> ModelFamily:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise AssayError(
            f"no native model for model_type {model_type!r} (native families: {', '.join(sorted(FAMILIES))}); use --path hf"
        ) from None


# ---------------------------------------------------------------- Qwen3 (dense and MoE)


def _qwen3_family() -> ModelFamily:
    from assay.models import qwen3
    from assay.models.qwen3.args import HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE
    from assay.models.qwen3.parallelize import _check_tp_divisible, parallelize_qwen3

    def flop_shape(args) -> FlopShape:
        counts = qwen3.count_parameters(qwen3.build_qwen3(args, device="meta"))
        return FlopShape(counts.active_matmul, args.n_layers, args.n_heads * args.head_dim)

    def load(path, spec, slice_experts, device, dtype):
        return qwen3.load_native_qwen3(path, spec, slice_experts=slice_experts, device=device, dtype=dtype)

    def check_tp(args, tp: int) -> None:
        if tp > 1:
            _check_tp_divisible(qwen3.build_qwen3(args, device="meta"), tp)

    def parallelize(model, mesh, tp: bool, dp_shard: bool):
        return parallelize_qwen3(model, mesh, tp=tp, dp_shard=dp_shard)

    def export_hf(state_dict, args, out_dir, tokenizer_source_dir):
        return qwen3.export_hf(state_dict, args, out_dir, tokenizer_source_dir=tokenizer_source_dir)

    return ModelFamily(
        name="qwen3",
        model_types=(HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE),
        args_from_hf_config=qwen3.Qwen3Args.from_hf_config,
        apply_spec=qwen3.apply_spec_overrides,
        flavours=qwen3.FLAVOURS,
        load=load,
        build=lambda args, device, dtype, seed: qwen3.build_qwen3(args, device=device, dtype=dtype, seed=seed),
        flop_shape=flop_shape,
        blocks=lambda model: list(model.layers),
        check_tp=check_tp,
        parallelize=parallelize,
        export_hf=export_hf,
    )


register_family(_qwen3_family())


# ---------------------------------------------------------------- GLA (gated linear attention, fla's layout)


def _gla_family() -> ModelFamily:
    from assay.models import gla
    from assay.models.gla.args import HF_MODEL_TYPE
    from assay.models.gla.parallelize import check_tp_divisible, parallelize_gla

    def load(path, spec, slice_experts, device, dtype):
        if slice_experts:
            raise AssayError("--slice-experts applies to mixture-of-experts models; GLA has no experts (use --spec layers=N)")
        return gla.load_native_gla(path, spec, device=device, dtype=dtype)

    def flop_shape(args) -> FlopShape:
        # attention_width 0: the recurrence costs O(T) per sequence, not the O(T^2) the PaLM term counts;
        # MFU counts the matmul weights (6N per token), the usual convention for linear attention.
        return FlopShape(gla.count_parameters(gla.build_gla(args, device="meta")).active_matmul, args.n_layers, 0)

    return ModelFamily(
        name="gla",
        model_types=(HF_MODEL_TYPE,),
        args_from_hf_config=gla.GLAArgs.from_hf_config,
        apply_spec=gla.apply_spec_overrides,
        flavours=gla.FLAVOURS,
        load=load,
        build=lambda args, device, dtype, seed: gla.build_gla(args, device=device, dtype=dtype, seed=seed),
        flop_shape=flop_shape,
        blocks=lambda model: list(model.layers),
        check_tp=lambda args, tp: check_tp_divisible(args, tp) if tp > 1 else None,
        parallelize=lambda model, mesh, tp, dp_shard: parallelize_gla(model, mesh, tp=tp, dp_shard=dp_shard),
        export_hf=lambda state_dict, args, out_dir, tokenizer_source_dir: gla.export_hf(
            state_dict, args, out_dir, tokenizer_source_dir=tokenizer_source_dir
        ),
    )


register_family(_gla_family())


# ---------------------------------------------------------------- any Transformers causal LM (the hf path)


def hf_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Transformers causal LM: the ModuleList with num_hidden_layers entries."""
    n_layers = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return list(module)
    raise AssayError(f"cannot find the {n_layers} decoder layers of {type(model).__name__}")


def hf_flop_shape(model: nn.Module, config: dict) -> FlopShape:
    """FLOP shape of a Transformers model: from its family when registered (same count as native), else
    every nn.Linear weight (dense models only: a fused MoE expert tensor is not an nn.Linear)."""
    family = FAMILIES.get(config.get("model_type"))
    if family is not None:
        return family.flop_shape(family.args_from_hf_config(config))
    active = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    n_heads = int(config.get("num_attention_heads", 0))
    head_dim = int(config.get("head_dim") or (int(config.get("hidden_size", 0)) // max(n_heads, 1)))
    return FlopShape(active, int(config.get("num_hidden_layers", 0)), n_heads * head_dim)
