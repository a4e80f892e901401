"""The three interchangeable model paths behind one trainer: `hf` (AutoModelForCausalLM with the
checkpoint's weights), `native` (the family's own model, the checkpoint's weights or a named flavour)
and `native` with kernels swapped in by the replacement registry.

Each path gives the trainer the same handle: logits for tokens, the transformer blocks (to compile),
the FLOP shape (for MFU), a random-init twin (for --check-init), parallelize and export.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config
from assay.models.registry import ArchSpec, FlopShape
from assay.train.hf_shape import hf_blocks, hf_flop_shape

PATHS = ("native", "hf")


@dataclass(frozen=True)
class ModelChoice:
    checkpoint: str
    path: str = "native"
    flavour: str | None = None  # native only: the family's named size, randomly initialised
    overrides: str | None = None  # native only: field overrides (--spec), "layers=4,experts=8,top_k=2"
    allow_sliced_checkpoint: bool = False
    seed: int = 0  # for a flavour's random init and for --check-init's random twin


class TrainModel:
    """A model on one path, as the trainer sees it."""

    path: str
    model: nn.Module
    family: ArchSpec | None
    checkpoint: Path
    config: dict
    vocab_size: int
    flop_shape: FlopShape
    has_checkpoint_weights: bool

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: [B, T] -> [B, T, vocab]
        raise NotImplementedError

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: [B, T] -> [B, T, dim]
        """The final normalised hidden states, the output head's input (for the chunked loss)."""
        raise NotImplementedError

    def output_weight(self) -> torch.Tensor | None:
        """The output head's weight [vocab, dim] when logits == hidden_states @ weight.T exactly (no bias,
        no soft-capping or scaling), else None: the trainer then uses the full logits."""
        return None

    def blocks(self) -> list[nn.Module]:
        raise NotImplementedError

    def random_twin(self, seed: int) -> "TrainModel":
        """The same architecture, randomly initialised (the --check-init baseline)."""
        raise NotImplementedError

    def check_parallel(self, tp: int) -> None:
        raise NotImplementedError

    def parallelize(self, mesh, tp: bool, dp_shard: bool) -> None:
        raise NotImplementedError

    def export(self, out_dir: Path, full_state_dict: dict) -> list[Path]:
        """Write a Transformers checkpoint from a full (gathered) state dict into out_dir (a fresh staging
        folder: assay.train.export makes the write atomic); rank 0 only."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"path": self.path, "family": self.family.name if self.family else None, "model_type": self.config.get("model_type")}


class NativeModel(TrainModel):
    path = "native"

    def __init__(self, model: nn.Module, args: Any, family: ArchSpec, checkpoint: Path, config: dict, has_weights: bool):
        self.model, self.args, self.family, self.checkpoint, self.config = model, args, family, checkpoint, config
        self.vocab_size = args.vocab_size
        self.flop_shape = family.flop_shape(args)
        self.has_checkpoint_weights = has_weights

    def logits(self, tokens):
        return self.model(tokens)

    def hidden_states(self, tokens):
        return self.model.hidden_states(tokens)

    def output_weight(self):
        head = getattr(self.model, "output", None)
        plain = hasattr(self.model, "hidden_states") and isinstance(head, nn.Linear) and head.bias is None
        return head.weight if plain else None

    def blocks(self):
        return self.family.blocks(self.model)

    def random_twin(self, seed):
        device = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        twin = self.family.build(self.args, device, dtype, seed)
        return NativeModel(twin, self.args, self.family, self.checkpoint, self.config, has_weights=False)

    def check_parallel(self, tp):
        self.family.check_tp(self.args, tp)

    def parallelize(self, mesh, tp, dp_shard):
        self.family.parallelize(self.model, mesh, tp, dp_shard)

    def export(self, out_dir, full_state_dict):
        return [Path(p) for p in self.family.export_hf(full_state_dict, self.args, out_dir, self.checkpoint)]

    def describe(self):
        return super().describe() | {"spec": dataclasses.asdict(self.args) if dataclasses.is_dataclass(self.args) else str(self.args)}


class HFModel(TrainModel):
    path = "hf"
    family = None

    def __init__(self, model: nn.Module, checkpoint: Path, config: dict, has_weights: bool = True):
        self.model, self.checkpoint, self.config = model, checkpoint, config
        self.vocab_size = int(model.config.vocab_size)
        self.flop_shape = hf_flop_shape(model, config)
        self.has_checkpoint_weights = has_weights

    def logits(self, tokens):
        return self.model(input_ids=tokens, use_cache=False).logits

    def hidden_states(self, tokens):
        return self.model.get_decoder()(input_ids=tokens, use_cache=False).last_hidden_state

    def output_weight(self):
        head = self.model.get_output_embeddings()
        config = self.model.config
        # Models that scale or soft-cap their logits (Gemma, Cohere) are not a plain linear head.
        plain = (
            isinstance(head, nn.Linear) and head.bias is None and getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "logit_scale", None) is None and hasattr(self.model, "get_decoder")
        )
        return head.weight if plain else None

    def blocks(self):
        return hf_blocks(self.model)

    def random_twin(self, seed):
        from transformers import AutoModelForCausalLM

        parameter = next(self.model.parameters())
        torch.manual_seed(seed)
        twin = AutoModelForCausalLM.from_config(self.model.config, dtype=parameter.dtype).to(parameter.device)
        return HFModel(twin, self.checkpoint, self.config, has_weights=False)

    def check_parallel(self, tp):
        if tp > 1:
            raise AssayError("--tp needs --path native (the hf path shards with FSDP over --dp-shard only)")

    def parallelize(self, mesh, tp, dp_shard):
        from torch.distributed.fsdp import fully_shard

        if dp_shard:
            for block in self.blocks():
                fully_shard(block, mesh=mesh["dp_shard"])
            fully_shard(self.model, mesh=mesh["dp_shard"], reshard_after_forward=False)

    def export(self, out_dir, full_state_dict):
        from transformers import AutoTokenizer

        out_dir = Path(out_dir)
        self.model.save_pretrained(out_dir, state_dict=full_state_dict)
        AutoTokenizer.from_pretrained(self.checkpoint).save_pretrained(out_dir)
        return sorted(out_dir.iterdir())


def load_model(choice: ModelChoice, device: torch.device, dtype: torch.dtype) -> TrainModel:
    if choice.path not in PATHS:
        raise AssayError(f"unknown --path {choice.path!r} (one of {', '.join(PATHS)})")
    folder = checkpoint_dir(choice.checkpoint)
    config = read_hf_config(folder)
    if choice.path == "hf":
        if choice.flavour or choice.overrides or choice.allow_sliced_checkpoint:
            raise AssayError("--flavour, --spec and --allow-sliced-checkpoint choose a native model; use them with --path native")
        return _load_hf(folder, config, device, dtype)
    family = _native_entry(config.get("model_type"))
    if choice.flavour is not None:
        if choice.flavour not in family.flavours:
            raise AssayError(f"unknown {family.name} flavour {choice.flavour!r}; known: {', '.join(family.flavours)}")
        args = family.apply_overrides(family.flavours[choice.flavour], choice.overrides)
        model = family.build(args, device, dtype, choice.seed)
        return NativeModel(model, args, family, folder, config, has_weights=False)
    model, args = family.load(folder, choice.overrides, choice.allow_sliced_checkpoint, device, dtype)
    return NativeModel(model, args, family, folder, config, has_weights=True)


def _load_hf(folder: Path, config: dict, device: torch.device, dtype: torch.dtype) -> HFModel:
    from transformers import AutoModelForCausalLM

    from assay.models.hf_checkpoint import INDEX_FILE, SINGLE_FILE

    # Safetensors only, as on the native path: a pytorch_model.bin is a pickle, and training never
    # unpickles a file it did not write (not even with torch.load's weights_only allow-list).
    if not ((folder / SINGLE_FILE).is_file() or (folder / INDEX_FILE).is_file()):
        raise AssayError(f"the checkpoint at {folder} has neither {SINGLE_FILE} nor {INDEX_FILE} (training reads safetensors only)")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
    except (OSError, ValueError, KeyError) as error:
        raise AssayError(f"Transformers cannot load {folder} as a causal LM: {str(error).splitlines()[0]}") from None
    return HFModel(model.to(device), folder, config)



def _native_entry(model_type: str | None) -> ArchSpec:
    """The registry's entry for model_type; refused with the way out (the hf path) when there is none."""
    from assay.models import registry

    spec = registry.find(model_type)
    if spec is None:
        raise AssayError(f"no native model for model_type {model_type!r} (native families: {', '.join(sorted(registry.model_types()))}); use --path hf")
    return spec


def apply_kernel_registry(model: nn.Module, names: list[str] | None, pattern: str | None, dry_run: bool):
    """The seam for the kernel replacement registry (assay.kernels.registry.apply_kernels)."""
    try:
        registry = importlib.import_module("assay.kernels.registry")
    except ModuleNotFoundError as missing:
        if missing.name in ("assay.kernels.registry", "assay.kernels"):
            raise AssayError("kernel registry not available (assay.kernels.registry is not installed)") from None
        raise
    return registry.apply_kernels(model, names, pattern, dry_run)
