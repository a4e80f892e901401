"""The native GLA causal LM: flavours, loading from / exporting to fla-layout checkpoints, state size.

    FLAVOURS["3B"]                                        the reference design's size, as data
    model, args = load_native_gla("zoo/gla")              a config.json + model.safetensors in fla's layout
    logits, state = model.prefill(tokens); logits, state = model.decode_step(next_tokens, state)
    export_hf(model, args, "out/", tokenizer_source_dir="zoo/gla")
    state_bytes_per_sequence(FLAVOURS["3B"])               28,311,552: the same at 10 tokens or 100,000
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.gla.args import (
    HF_MODEL_TYPE,
    GLAArgs,
    apply_spec_overrides,
    fla_intermediate_size,
    parse_spec_overrides,
)
from assay.models.gla.model import GLA, ParamCounts, State, count_parameters
from assay.models.gla.state_dict_adapter import from_hf, to_hf
from assay.models.hf_checkpoint import DEFAULT_MAX_SHARD_BYTES, export_native_model, load_native_checkpoint
from assay.models.registry import ArchSpec, register
from assay.models.serving import FIXED_STATE, state_bytes

# "tiny" has the zoo's sizes (hidden 64, 2 layers, 4 heads, SwiGLU 128, the zoo tokenizer's 1024 tokens).
# "1.3B" is fla-hub/gla-1.3B-100B's config.json. "3B" is the fixed-state reference (3.028B parameters,
# 24 layers; shared/context/fixed-state.md); the article gives neither width, heads nor vocabulary, so:
# hidden 3072 with fla's defaults (expand_k 0.5, expand_v 1, hidden_ratio 4) and a 50,304-token
# vocabulary (GPT-2's 50,257 padded to a multiple of 64) land on 3.029B; 16 heads put the float32
# state at 28.3 MB per sequence, next to the article's "about 29.5 MB".
_TINY = GLAArgs(vocab_size=1024, dim=64, n_layers=2, n_heads=4, hidden_dim=128)
FLAVOURS: dict[str, GLAArgs] = {
    "tiny": _TINY,
    "tiny-tied": replace(_TINY, tie_embeddings=True),
    "340M": GLAArgs(vocab_size=32000, dim=1024, n_layers=24, n_heads=4, tie_embeddings=True),
    "1.3B": GLAArgs(vocab_size=32000, dim=2048, n_layers=24, n_heads=4),
    "2.7B": GLAArgs(vocab_size=32000, dim=2560, n_layers=32, n_heads=5),
    "3B": GLAArgs(vocab_size=50304, dim=3072, n_layers=24, n_heads=16, chunk_size=128),
}

def flavour(name: str) -> GLAArgs:
    try:
        return FLAVOURS[name]
    except KeyError:
        raise AssayError(f"unknown GLA flavour {name!r}; known: {', '.join(FLAVOURS)}") from None


def state_bytes_per_sequence(args: GLAArgs, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one sequence's decoding state: layers x heads x K_head x V_head x element size, plus
    layers x (conv_size - 1) x (2 key_dim + value_dim) with short convolutions.

    Nothing in it grows with the sequence (compare assay.models.memory.kv_cache_bytes_per_sequence).
    float32 by default: the recurrence accumulates, and hands back, its state in float32.
    """
    return state_bytes(args, 0, dtype)


def build_gla(args: GLAArgs, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0, std: float = 0.02) -> GLA:
    """A randomly initialised model (on "meta": shapes only, for counting or parallelize-then-materialise)."""
    return GLA.build(args, device, dtype, seed, std)


def load_native_gla(
    path_or_dir: str | os.PathLike,
    spec_overrides: str | Mapping[str, Any] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[GLA, GLAArgs]:
    """Build the native GLA that the checkpoint's config.json describes (after overrides) and load its weights."""
    return load_native_checkpoint(path_or_dir, GLAArgs.from_hf_config, apply_spec_overrides, from_hf, GLA, "GLA",
                                  spec_overrides, device, dtype)


def export_hf(
    model: nn.Module | Mapping[str, torch.Tensor],
    args: GLAArgs,
    out_dir: str | os.PathLike,
    tokenizer_source_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_config: Mapping[str, Any] | None = None,
) -> list[os.PathLike]:
    """Write an fla-layout checkpoint: safetensors with GLAForCausalLM's key names, config.json
    (model_type "gla"), and from the source checkpoint its tokenizer files and generation_config.json.

    `model` is a native GLA or its full (gathered, plain-tensor) state dict. extra_config: further
    config.json fields (token ids when there is no source checkpoint to copy them from).
    """
    return export_native_model(model, args, to_hf, out_dir, tokenizer_source_dir, max_shard_bytes, extra_config)


# ---------------------------------------------------------------- the registry entry


def _load(path_or_dir, spec_overrides=None, slice_experts: bool = False, device="cpu", dtype=torch.float32):
    if slice_experts:
        raise AssayError("--slice-experts applies to mixture-of-experts models; GLA has no experts (use --spec layers=N)")
    return load_native_gla(path_or_dir, spec_overrides, device=device, dtype=dtype)


def args_for_size(vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int, max_seq_len: int) -> GLAArgs:
    # chunk_size 64, the GLA default: any length runs (gla_chunk pads the last chunk).
    return GLAArgs(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, hidden_dim=hidden_dim, max_seq_len=max_seq_len)


SPEC = register(ArchSpec(
    name="gla",
    label="GLA",
    model_types=(HF_MODEL_TYPE,),
    args_from_hf=GLAArgs.from_hf_config,
    apply_spec=apply_spec_overrides,
    model_cls=GLA,
    init=lambda args, device="meta", dtype=torch.float32, seed=0: build_gla(args, device, dtype, seed),
    load=_load,
    export_hf=export_hf,
    parallelize_fn="assay.models.gla.parallelize:parallelize_gla",
    check_tp_fn="assay.models.gla.parallelize:check_tp_divisible",
    cache=FIXED_STATE,
    kernel_targets={"gla_chunk": "layers.*.attention.gla"},
    flavours=FLAVOURS,
    args_for_size=args_for_size,
))


__all__ = [
    "FLAVOURS",
    "SPEC",
    "GLA",
    "GLAArgs",
    "ParamCounts",
    "State",
    "apply_spec_overrides",
    "build_gla",
    "count_parameters",
    "export_hf",
    "fla_intermediate_size",
    "flavour",
    "from_hf",
    "load_native_gla",
    "parse_spec_overrides",
    "state_bytes_per_sequence",
    "to_hf",
]
