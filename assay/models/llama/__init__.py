"""The native Llama (Llama 2/3, SmolLM2, Mistral-dense): flavours, loading from / exporting to
Transformers checkpoints, and its registry entry. The worked example of docs/architecture.md.

    FLAVOURS["SmolLM2-135M"]                              a size, as data
    model, args = load_native_llama("ckpt/")              any Transformers Llama folder: safetensors single
                                                          or sharded, tied or untied, no `architectures` needed
    export_hf(model, args, "out/", tokenizer_source_dir="ckpt/")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.hf_checkpoint import DEFAULT_MAX_SHARD_BYTES, export_native_model, load_native_checkpoint
from assay.models.llama.args import HF_MODEL_TYPES, LlamaArgs, apply_spec_overrides, parse_spec_overrides
from assay.models.llama.model import Llama, count_parameters
from assay.models.llama.state_dict_adapter import from_hf, to_hf
from assay.models.registry import ArchSpec, register
from assay.models.serving import KV_CACHE

# Published sizes (their config.json) and a tiny one with the zoo's sizes (its tokenizer's 1024 tokens).
_LLAMA3_VOCAB = 128256
FLAVOURS: dict[str, LlamaArgs] = {
    "tiny": LlamaArgs(vocab_size=1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, tie_embeddings=True),
    "SmolLM2-135M": LlamaArgs(
        vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_dim=1536,
        rope_theta=100000.0, max_seq_len=8192, tie_embeddings=True,
    ),
    "3.2-1B": LlamaArgs(
        vocab_size=_LLAMA3_VOCAB, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, hidden_dim=8192,
        rope_theta=500000.0, max_seq_len=131072, tie_embeddings=True,
        rope_type="llama3", rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
    ),
    "3.1-8B": LlamaArgs(
        vocab_size=_LLAMA3_VOCAB, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
        rope_theta=500000.0, max_seq_len=131072,
        rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
    ),
}


def flavour(name: str) -> LlamaArgs:
    try:
        return FLAVOURS[name]
    except KeyError:
        raise AssayError(f"unknown Llama flavour {name!r}; known: {', '.join(FLAVOURS)}") from None


def build_llama(args: LlamaArgs, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> Llama:
    """A randomly initialised model (on "meta": shapes only, for counting or for parallelize-then-materialise)."""
    return Llama.build(args, device, dtype, seed)


def load_native_llama(
    path_or_dir: str | os.PathLike,
    spec_overrides: str | Mapping[str, Any] | None = None,
    slice_experts: bool = False,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[Llama, LlamaArgs]:
    """Build the native Llama that the checkpoint's config.json describes (after overrides) and load its weights.

    slice_experts (the trainer's --slice-experts): allow a spec with fewer layers than the checkpoint.
    """
    return load_native_checkpoint(path_or_dir, LlamaArgs.from_hf_config, apply_spec_overrides, from_hf, Llama, "Llama",
                                  spec_overrides, device, dtype, slice_layers=slice_experts)


def export_hf(
    model: nn.Module | Mapping[str, torch.Tensor],
    args: LlamaArgs,
    out_dir: str | os.PathLike,
    tokenizer_source_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_config: Mapping[str, Any] | None = None,
) -> list[os.PathLike]:
    """Write a Transformers checkpoint (safetensors, config.json, and from the source checkpoint its
    tokenizer files and generation_config.json) that AutoModelForCausalLM.from_pretrained reloads.

    `model` is a native Llama or its full (gathered, plain-tensor) state dict.
    """
    return export_native_model(model, args, to_hf, out_dir, tokenizer_source_dir, max_shard_bytes, extra_config)


# ---------------------------------------------------------------- the registry entry


def args_for_size(vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int, max_seq_len: int) -> LlamaArgs:
    """Multi-head (as many key/value heads as query heads) at dim / n_heads per head, untied."""
    if dim % n_heads:
        raise AssayError(f"dim {dim} is not a multiple of {n_heads} heads")
    return LlamaArgs(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                     head_dim=dim // n_heads, hidden_dim=hidden_dim, max_seq_len=max_seq_len)


SPEC = register(ArchSpec(
    name="llama",
    label="attention (Llama)",
    model_types=HF_MODEL_TYPES,
    args_from_hf=LlamaArgs.from_hf_config,
    apply_spec=apply_spec_overrides,
    model_cls=Llama,
    init=build_llama,
    load=load_native_llama,
    export_hf=export_hf,
    parallelize_fn="assay.models.llama.parallelize:parallelize_llama",
    check_tp_fn="assay.models.llama.parallelize:check_tp_divisible",
    cache=KV_CACHE,
    kernel_targets={"rope": "layers.*.attention.rope", "attention": "layers.*.attention.sdpa"},
    flavours=FLAVOURS,
    args_for_size=args_for_size,
))

__all__ = [
    "FLAVOURS", "SPEC", "Llama", "LlamaArgs", "apply_spec_overrides", "build_llama", "count_parameters", "export_hf",
    "flavour", "from_hf", "load_native_llama", "parse_spec_overrides", "to_hf",
]
