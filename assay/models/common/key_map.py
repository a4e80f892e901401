"""The key map base (torchtitan's StateDictAdapter, made declarative): the key loop between a native
model's state dict and its checkpoint's, written once.

An architecture's key map declares
  TOP_LEVEL   native key -> checkpoint key for the embedding, final norm and output head
  PER_LAYER   native key after `layers.{i}.` -> checkpoint key after `model.layers.{i}.`
and overrides hooks only where it differs: `layer_keys` (the keys one block has for these args),
`hf_names` (a key stored under other names too), `layer_to_hf` / `read_layer` (tensors that are not
a rename: Qwen3's stacked experts), `reductions` (what smaller args drop).

to_hf: native -> checkpoint names (views, no copies); lm_head dropped when tied; a native key with no
checkpoint name is an AssayError. from_hf: reads only the tensors the args need (the source may be
lazy), a tied checkpoint's stray lm_head accepted; every missing and every unused tensor is named.
Args with fewer layers than the checkpoint load only when slicing was asked for (--allow-sliced-checkpoint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from assay.core.errors import AssayError

HF_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
NATIVE_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(.+)$")


# Transformers' names of the shared layers' tensors (after `model.layers.{i}.`), weights and biases: what
# Llama, Qwen3 and Gemma 3 checkpoints call the Attention and MLP of assay.models.common.
HF_ATTENTION_KEYS = {f"attention.w{n}.{kind}": f"self_attn.{n}_proj.{kind}" for n in "qkvo" for kind in ("weight", "bias")}
HF_QK_NORM_KEYS = {"attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight"}
HF_MLP_KEYS = {f"mlp.{w}.{kind}": f"mlp.{proj}.{kind}" for w, proj in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
               for kind in ("weight", "bias")}


def few(keys, limit: int = 5) -> str:
    """Up to `limit` keys, sorted, then how many there are in all."""
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def layer_of(hf_key: str) -> int | None:
    match = HF_LAYER_KEY.match(hf_key)
    return int(match.group(1)) if match else None


def checkpoint_layers(hf_keys) -> int:
    layer_ids = [layer for key in hf_keys if (layer := layer_of(key)) is not None]
    return max(layer_ids) + 1 if layer_ids else 0


@dataclass
class Reading:
    """One from_hf pass: what was taken, what was missing, which checkpoint keys were used."""

    source: Mapping[str, torch.Tensor]
    native: dict[str, torch.Tensor] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)

    def take(self, native_key: str, *hf_keys: str) -> bool:
        """The first of hf_keys the checkpoint has, under native_key; the first name is reported missing."""
        for hf_key in hf_keys:
            if hf_key in self.source:
                self.native[native_key] = self.source[hf_key]
                self.consumed.add(hf_key)
                return True
        self.missing.append(hf_keys[0])
        return False


class KeyMap:
    FAMILY: ClassVar[str] = "model"  # for messages: "Llama", "Qwen3", "GLA"
    SOURCE: ClassVar[str] = "Transformers"  # whose names the checkpoint uses: "Transformers", "fla"
    TOP_LEVEL: ClassVar[Mapping[str, str]] = {
        "tok_embeddings.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    PER_LAYER: ClassVar[Mapping[str, str]] = {}
    # Keys some older checkpoints carry that hold nothing a model needs (derived rotary frequencies).
    IGNORED_HF_SUFFIXES: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)

    def __init__(self, args: Any):
        self.args = args

    # ---------------------------------------------------------------- hooks

    def layer_keys(self, layer_id: int) -> list[str]:
        """The state-dict keys of native block layer_id, without the `layers.{i}.` prefix."""
        return list(self.PER_LAYER)

    def hf_names(self, rest: str) -> tuple[str, ...]:
        """Checkpoint names of a per-layer native key (after the layer prefix): written as the first,
        read under any."""
        return (self.PER_LAYER[rest],)

    def layer_to_hf(self, rest: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """{checkpoint name after the layer prefix: tensor} for one per-layer native tensor; None: no name."""
        if rest not in self.PER_LAYER:
            return None
        return {self.hf_names(rest)[0]: tensor}

    def read_layer(self, reading: Reading, layer_id: int, rest: str) -> None:
        """Take one per-layer native tensor from the checkpoint."""
        prefix = f"model.layers.{layer_id}."
        reading.take(f"layers.{layer_id}.{rest}", *(prefix + name for name in self.hf_names(rest)))

    def reductions(self, hf_state_dict: Mapping[str, torch.Tensor]) -> list[str]:
        """What the args keep of a larger checkpoint ("2 of its 4 layers"); AssayError when the checkpoint
        is smaller than the spec."""
        in_checkpoint = checkpoint_layers(hf_state_dict.keys())
        if in_checkpoint < self.args.n_layers:
            raise AssayError(f"the spec asks for {self.args.n_layers} layers but the checkpoint has {in_checkpoint}")
        return [f"{self.args.n_layers} of its {in_checkpoint} layers"] if in_checkpoint > self.args.n_layers else []

    # ---------------------------------------------------------------- the loops

    def to_hf(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Native state dict -> checkpoint keys (views of the native tensors); lm_head dropped when tied."""
        hf: dict[str, torch.Tensor] = {}
        unknown = []
        for key, tensor in state_dict.items():
            if key in self.TOP_LEVEL:
                if not (key == "output.weight" and self.args.tie_embeddings):  # tied: the loader rebuilds lm_head
                    hf[self.TOP_LEVEL[key]] = tensor
                continue
            match = NATIVE_LAYER_KEY.match(key)
            renamed = self.layer_to_hf(match.group(2), tensor) if match else None
            if renamed is None:
                unknown.append(key)
                continue
            hf.update({f"model.layers.{match.group(1)}.{name}": value for name, value in renamed.items()})
        if unknown:
            raise AssayError(f"native {self.FAMILY} state dict has keys with no {self.SOURCE} name: {few(unknown)}")
        return hf

    def from_hf(self, hf_state_dict: Mapping[str, torch.Tensor], allow_sliced_checkpoint: bool = False) -> dict[str, torch.Tensor]:
        """Checkpoint state dict (may be lazy: only the tensors the args need are read) -> native keys.

        Args smaller than the checkpoint (fewer layers, or fewer experts) load only with allow_sliced_checkpoint=True.
        """
        reduced = self.reductions(hf_state_dict)
        if reduced and not allow_sliced_checkpoint:
            raise AssayError("the spec is smaller than the checkpoint: it keeps only the first " + " and ".join(reduced)
                             + "; pass allow_sliced_checkpoint=True (--allow-sliced-checkpoint) to load a sliced copy on purpose")
        reading = Reading(hf_state_dict)
        reading.take("tok_embeddings.weight", self.TOP_LEVEL["tok_embeddings.weight"])
        reading.take("norm.weight", self.TOP_LEVEL["norm.weight"])
        if self.args.tie_embeddings:
            # A tied checkpoint may still carry lm_head.weight (a copy of the embedding); the model shares one tensor.
            reading.consumed.add(self.TOP_LEVEL["output.weight"])
            if "tok_embeddings.weight" in reading.native:
                reading.native["output.weight"] = reading.native["tok_embeddings.weight"]
        else:
            reading.take("output.weight", self.TOP_LEVEL["output.weight"])
        for layer_id in range(self.args.n_layers):
            for rest in self.layer_keys(layer_id):
                self.read_layer(reading, layer_id, rest)
        if reading.missing:
            raise AssayError(f"checkpoint lacks {len(reading.missing)} tensors the {self.FAMILY} spec needs: {few(reading.missing)}")
        unexpected = [
            key for key in hf_state_dict.keys()
            if key not in reading.consumed and not key.endswith(self.IGNORED_HF_SUFFIXES)
            and not (allow_sliced_checkpoint and (layer_of(key) or 0) >= self.args.n_layers)
        ]
        if unexpected:
            raise AssayError(f"checkpoint has {len(unexpected)} tensors the {self.FAMILY} spec does not use: {few(unexpected)}")
        return reading.native
