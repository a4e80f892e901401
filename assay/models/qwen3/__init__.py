"""The native Qwen3 (dense and MoE): flavours, and loading from / exporting to Hugging Face checkpoints.

    FLAVOURS["4B"]                                   a size, as data
    replace(FLAVOURS["32B"], dim=2560, n_layers=36, n_heads=32, hidden_dim=9728)   the guide's 4B
    model, args = load_native_qwen3("ckpt/", "layers=4,experts=64", slice_experts=True)
    export_hf(model, args, "out/", tokenizer_source_dir="ckpt/")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.hf_checkpoint import DEFAULT_MAX_SHARD_BYTES, export_native_model, load_native_checkpoint
from assay.models.qwen3.args import HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE, Qwen3Args, apply_spec_overrides, parse_spec_overrides
from assay.models.qwen3.model import ParamCounts, Qwen3, count_parameters
from assay.models.qwen3.state_dict_adapter import from_hf, to_hf
from assay.models.registry import ArchSpec, register
from assay.models.serving import KV_CACHE

# Sizes of the published Qwen3 checkpoints (their config.json), plus two tiny ones for tests.
# The tiny ones have the zoo's sizes (vocabulary of its tokenizer, 1024) so they train on the zoo corpus.
_QWEN3_VOCAB = 151936
_TINY = Qwen3Args(vocab_size=1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, max_seq_len=2048)
_DENSE_0_6B = Qwen3Args(
    vocab_size=_QWEN3_VOCAB, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden_dim=3072, tie_embeddings=True
)
FLAVOURS: dict[str, Qwen3Args] = {
    "tiny": _TINY,
    "tiny-moe": replace(_TINY, n_experts=8, top_k=2, moe_hidden_dim=32),
    "0.6B": _DENSE_0_6B,
    "1.7B": replace(_DENSE_0_6B, dim=2048, hidden_dim=6144),
    "4B": replace(_DENSE_0_6B, dim=2560, n_layers=36, n_heads=32, hidden_dim=9728),
    "8B": replace(_DENSE_0_6B, dim=4096, n_layers=36, n_heads=32, hidden_dim=12288, tie_embeddings=False),
    "14B": replace(_DENSE_0_6B, dim=5120, n_layers=40, n_heads=40, hidden_dim=17408, tie_embeddings=False),
    "32B": replace(_DENSE_0_6B, dim=5120, n_layers=64, n_heads=64, hidden_dim=25600, tie_embeddings=False),
    "30B-A3B": Qwen3Args(
        vocab_size=_QWEN3_VOCAB, dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, hidden_dim=6144,
        n_experts=128, top_k=8, moe_hidden_dim=768, norm_topk_prob=True,
    ),
    "235B-A22B": Qwen3Args(
        vocab_size=_QWEN3_VOCAB, dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, hidden_dim=12288,
        n_experts=128, top_k=8, moe_hidden_dim=1536, norm_topk_prob=True,
    ),
}

def flavour(name: str) -> Qwen3Args:
    try:
        return FLAVOURS[name]
    except KeyError:
        raise AssayError(f"unknown Qwen3 flavour {name!r}; known: {', '.join(FLAVOURS)}") from None


def build_qwen3(args: Qwen3Args, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> Qwen3:
    """A randomly initialised model (on "meta": shapes only, for counting or for parallelize-then-materialise)."""
    return Qwen3.build(args, device, dtype, seed)


def load_native_qwen3(
    path_or_dir: str | os.PathLike,
    spec_overrides: str | Mapping[str, Any] | None = None,
    slice_experts: bool = False,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[Qwen3, Qwen3Args]:
    """Build the native Qwen3 that the checkpoint's config.json describes (after overrides) and load its weights.

    A spec with fewer layers or experts than the checkpoint loads only with slice_experts=True: the
    first layers, the first experts and the matching router rows.
    """
    return load_native_checkpoint(path_or_dir, Qwen3Args.from_hf_config, apply_spec_overrides, from_hf, Qwen3, "Qwen3",
                                  spec_overrides, device, dtype, slice_experts=slice_experts)


def export_hf(
    model: nn.Module | Mapping[str, torch.Tensor],
    args: Qwen3Args,
    out_dir: str | os.PathLike,
    tokenizer_source_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_config: Mapping[str, Any] | None = None,
) -> list[os.PathLike]:
    """Write a Transformers checkpoint (safetensors, config.json, and from the source checkpoint its
    tokenizer files and generation_config.json) that AutoModelForCausalLM.from_pretrained reloads.

    `model` is a native Qwen3 or its full (gathered, plain-tensor) state dict.
    """
    return export_native_model(model, args, to_hf, out_dir, tokenizer_source_dir, max_shard_bytes, extra_config)


# ---------------------------------------------------------------- the registry entry


def args_for_size(vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int, max_seq_len: int) -> Qwen3Args:
    """Multi-head (as many key/value heads as query heads) at dim / n_heads per head."""
    if dim % n_heads:
        raise AssayError(f"dim {dim} is not a multiple of {n_heads} heads")
    return Qwen3Args(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                     head_dim=dim // n_heads, hidden_dim=hidden_dim, max_seq_len=max_seq_len)


SPEC = register(ArchSpec(
    name="qwen3",
    label="attention (Qwen3)",
    model_types=(HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE),
    args_from_hf=Qwen3Args.from_hf_config,
    apply_spec=apply_spec_overrides,
    model_cls=Qwen3,
    init=build_qwen3,
    load=load_native_qwen3,
    export_hf=export_hf,
    parallelize_fn="assay.models.qwen3.parallelize:parallelize_qwen3",
    check_tp_fn="assay.models.qwen3.parallelize:check_tp_divisible",
    cache=KV_CACHE,
    kernel_targets={"rope": "layers.*.attention.rope", "attention": "layers.*.attention.sdpa", "grouped_experts": "layers.*.moe.experts"},
    flavours=FLAVOURS,
    args_for_size=args_for_size,
))


__all__ = [
    "FLAVOURS",
    "SPEC",
    "ParamCounts",
    "Qwen3",
    "Qwen3Args",
    "apply_spec_overrides",
    "build_qwen3",
    "count_parameters",
    "export_hf",
    "flavour",
    "from_hf",
    "load_native_qwen3",
    "parse_spec_overrides",
    "to_hf",
]
