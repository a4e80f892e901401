"""Matched-size GLA and attention (native Qwen3) checkpoints for the recall comparison, and their state sizes.

Both architectures get the same width, depth, heads and SwiGLU width, so the only difference is how a
layer mixes tokens: a fixed [K, V] matrix per head (GLA) or keys and values for every token (attention).
GLA's projections (q, k at dim/2; v, output gate, out at dim; a low-rank gate) and Qwen3's (q, k, v,
out at dim, multi-head: as many key/value heads as query heads, like Zoology's attention baseline)
land within a few percent of each other; `matched_params` checks the counts are within 10%.

Every architecture question (args at a size, build, state bytes, export) goes to the architecture
registry (assay.models.registry); ARCHS is only which entries this comparison uses.

A checkpoint is an ordinary model folder (config.json, safetensors, the zoo tokenizer) written by the
entry's export_hf, so the trainer loads it like any other model, plus recall.json: the MQAR token
layout it is trained on, which `assay recall needle --format tokens` reads back.
"""

from __future__ import annotations

import dataclasses

import json
import tempfile
from pathlib import Path

import torch

from assay.core.errors import AssayError
from assay.core.files import atomic_folder, atomic_write_json, atomic_write_text
from assay.recall.shapes import ARCHS, MQARLayout, ModelSize
from assay.core.tokens import TOKEN_IDS

LAYOUT_FILE = "recall.json"
MATCH_TOLERANCE = 0.10  # parameter counts of the two architectures may differ by at most this fraction


def _spec(arch: str):
    from assay.models import registry

    if arch not in ARCHS:
        raise AssayError(f"unknown architecture {arch!r} (one of {', '.join(ARCHS)})")
    return registry.get(arch)


def model_args(arch: str, size: ModelSize):
    """The architecture's args dataclass at `size` (its registry entry's args_for_size)."""
    args = _spec(arch).args_for_size(vocab_size=size.vocab_size, dim=size.dim, n_layers=size.n_layers, n_heads=size.n_heads,
                                     hidden_dim=size.hidden_dim, max_seq_len=size.max_seq_len)
    # The key width sets a linear-attention state's size (the sweep's axis); attention has no such field.
    if hasattr(args, "expand_k"):
        args = dataclasses.replace(args, expand_k=size.gla_expand_k, use_short_conv=size.gla_short_conv)
    return args


def build_model(arch: str, size: ModelSize, seed: int = 0):
    """A randomly initialised native model: normal(0, size.init_std) matrices, unit norms (Transformers' init)."""
    args = model_args(arch, size)
    return _spec(arch).model_cls.build(args, "cpu", torch.float32, seed, std=size.init_std), args


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def key_width(arch: str, size: ModelSize) -> float | None:
    """The key width / dim that sets a linear-attention state's size, or None for an architecture without one."""
    return getattr(model_args(arch, size), "expand_k", None)


def has_short_conv(arch: str, size: ModelSize) -> bool | None:
    """Whether the architecture's layers at `size` have short convolutions; None for one without the switch."""
    return getattr(model_args(arch, size), "use_short_conv", None)


def state_bytes(arch: str, args, seq_len: int) -> int:
    """Per-sequence decoding memory at `seq_len` tokens, float32: a fixed state, or a KV cache that grows."""
    return _spec(arch).state_bytes_per_sequence(args, seq_len, torch.float32)


def arch_label(arch: str) -> str:
    """How plots and tables name the architecture: "GLA", "attention (Qwen3)"."""
    return _spec(arch).label


def state_kind(arch: str) -> str:
    return _spec(arch).cache.kind


def matched_params(size: ModelSize, archs: tuple[str, ...] = ARCHS) -> dict[str, int]:
    """Total parameters per architecture at `size`; AssayError when they differ by more than 10%."""
    counts = {arch: param_count(_spec(arch).build(model_args(arch, size), "meta")) for arch in archs}
    low, high = min(counts.values()), max(counts.values())
    if high > low * (1 + MATCH_TOLERANCE):
        raise AssayError(f"parameter counts are not matched within {MATCH_TOLERANCE:.0%}: {counts}")
    return counts


def write_checkpoint(model: torch.nn.Module | dict, arch: str, args, out_dir: Path, layout: MQARLayout | None) -> Path:
    """Export a native model (or its state dict) as a checkpoint folder with the zoo tokenizer and recall.json."""
    from assay.zoo.tokenizer import write_tokenizer

    out_dir = Path(out_dir)
    # The folder appears whole (staged beside it, then swapped in): a reader never finds weights without recall.json.
    with tempfile.TemporaryDirectory(prefix="recall-tokenizer-") as source, atomic_folder(out_dir) as staging:
        # The export copies tokenizer files and token ids from a source checkpoint folder.
        write_tokenizer(source)
        atomic_write_text(Path(source) / "config.json", json.dumps(TOKEN_IDS) + "\n")
        state_dict = model.state_dict() if isinstance(model, torch.nn.Module) else model
        _spec(arch).export_hf(state_dict, args, staging, source)
        if layout is not None:
            atomic_write_json(staging / LAYOUT_FILE, {"mqar": layout.as_dict()})
    return out_dir


def read_layout(checkpoint: Path) -> MQARLayout | None:
    """The MQAR token layout a `recall train` checkpoint was trained on, or None for any other model."""
    path = Path(checkpoint) / LAYOUT_FILE
    if not path.is_file():
        return None
    try:
        return MQARLayout(**json.loads(path.read_text())["mqar"])
    except (ValueError, KeyError, TypeError) as error:
        raise AssayError(f"{path} is not a recall layout file: {error}") from None
