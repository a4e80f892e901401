"""Hugging Face checkpoint folders, model-agnostic: read safetensors (one file or sharded with
model.safetensors.index.json) into a state dict, and write one back with config.json and the
tokenizer files of a source checkpoint. Every file is written atomically (assay.core.files).

Key names are the caller's business: a model's key_map maps them (assay.models.registry's
ArchSpec.load and export_hf put the two together).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from assay.core.construct import default_device
from assay.core.errors import AssayError
from assay.core.files import atomic_path, atomic_write_json

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Copied verbatim from the source checkpoint on export: what AutoTokenizer and generate() read.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
GENERATION_CONFIG_FILE = "generation_config.json"
# 5 GB, Transformers' long-standing default: small enough for the Hub's per-file limit and for loaders
# that read a whole shard into host memory.
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """The checkpoint folder for a folder, or for a file inside one (config.json, a shard, the index)."""
    location = Path(path)
    if location.is_file():
        location = location.parent
    if not location.is_dir():
        raise AssayError(f"no checkpoint at {path}: not a file or folder")
    return location


def read_hf_config(path: str | os.PathLike) -> dict:
    config_path = checkpoint_dir(path) / CONFIG_FILE
    if not config_path.is_file():
        raise AssayError(f"the checkpoint at {config_path.parent} has no {CONFIG_FILE}")
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise AssayError(f"{config_path} is not valid JSON: {error}") from None


class SafetensorsStateDict(Mapping):
    """A lazy state dict over a checkpoint's safetensors files: a tensor is read when indexed.

    Loading a reduced model from a large checkpoint therefore reads only the tensors it keeps.
    """

    def __init__(self, path: str | os.PathLike):
        self.folder = checkpoint_dir(path)
        self._handles: dict[str, Any] = {}
        index_path = self.folder / INDEX_FILE
        single_path = self.folder / SINGLE_FILE
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError) as error:
                raise AssayError(f"{index_path} is not a safetensors index (weight_map): {error}") from None
            self.weight_map: dict[str, str] = dict(weight_map)
            for shard in sorted(set(self.weight_map.values())):
                if not (self.folder / shard).is_file():
                    raise AssayError(f"{index_path} names shard {shard}, which is not in {self.folder}")
        elif single_path.is_file():
            with self._open(SINGLE_FILE) as handle:
                self.weight_map = {key: SINGLE_FILE for key in handle.keys()}
        else:
            raise AssayError(f"the checkpoint at {self.folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")

    def _open(self, filename: str):
        try:
            return safe_open(str(self.folder / filename), framework="pt", device="cpu")
        except (SafetensorError, OSError) as error:
            raise AssayError(f"cannot read {self.folder / filename}: {error}") from None

    def __getitem__(self, key: str) -> torch.Tensor:
        filename = self.weight_map[key]  # KeyError for an absent key, as a Mapping must
        # One open handle per shard: a large MoE checkpoint has tens of thousands of per-expert
        # tensors, and reopening parses the shard's header each time.
        handle = self._handles.get(filename)
        if handle is None:
            handle = self._handles[filename] = self._open(filename)
        try:
            return handle.get_tensor(key)
        except SafetensorError as error:
            raise AssayError(f"cannot read tensor {key} from {self.folder / filename}: {error}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.weight_map)

    def __len__(self) -> int:
        return len(self.weight_map)

    def __contains__(self, key: object) -> bool:
        return key in self.weight_map


def read_hf_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, read eagerly, as stored on disk (keys and dtypes untouched)."""
    lazy = SafetensorsStateDict(path)
    state: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for key, filename in lazy.weight_map.items():
        by_file.setdefault(filename, []).append(key)
    for filename, keys in by_file.items():  # one open per shard, not per tensor
        with lazy._open(filename) as handle:
            for key in keys:
                state[key] = handle.get_tensor(key)
    return state


def _owned(tensor: torch.Tensor, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """On device in dtype, owning its memory: a slice of a fused tensor must not pin the whole tensor."""
    tensor = tensor.to(device=device, dtype=dtype)
    if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def load_into_meta_model(
    model_cls: Callable[[Any], torch.nn.Module],
    args: Any,
    native: Mapping[str, torch.Tensor],
    device: torch.device | str,
    dtype: torch.dtype,
    family: str,
) -> torch.nn.Module:
    """`model_cls(args)` built on "meta", then given `native`'s tensors (native key names) on device in dtype.

    AssayError naming up to four tensors whose shape does not fit the spec. A tensor that stands
    under two keys (a tied embedding/output) is converted once; assign=True leaves them two Parameters,
    which the caller ties again (NativeDecoder.from_state_dict).
    """
    with default_device("meta"):
        model = model_cls(args)
    expected = model.state_dict()
    mismatched = [
        f"{key} {tuple(native[key].shape)} vs spec {tuple(meta.shape)}"
        for key, meta in expected.items()
        if tuple(native[key].shape) != tuple(meta.shape)
    ]
    if mismatched:
        shown = "; ".join(mismatched[:4]) + (f"; ... ({len(mismatched)} in all)" if len(mismatched) > 4 else "")
        raise AssayError(f"checkpoint tensors do not fit the {family} spec: {shown}")
    converted: dict[int, torch.Tensor] = {}  # by id: a tied embedding/output is converted once
    weights = {}
    for key in expected:
        if id(native[key]) not in converted:
            converted[id(native[key])] = _owned(native[key], device, dtype)
        weights[key] = converted[id(native[key])]
    model.load_state_dict(weights, strict=True, assign=True)
    return model


def _plain_cpu_tensor(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor that owns its storage: safetensors refuses views sharing memory."""
    tensor = tensor.detach()
    if type(tensor) is not torch.Tensor:  # a DTensor (FSDP / TP shard) holds only this rank's part
        raise AssayError(
            f"tensor {key} is a {type(tensor).__name__}; gather a full state dict first "
            "(torch.distributed.checkpoint.state_dict.get_model_state_dict(..., full_state_dict=True))"
        )
    if tensor.is_meta:
        raise AssayError(f"tensor {key} is on the meta device: the model has no weights to export")
    tensor = tensor.to("cpu").contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()  # a slice of a bigger tensor (an unstacked expert, for one)
    return tensor


def _plan_shards(state_dict: Mapping[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Greedy, in key order, so a layer's tensors stay together; a tensor over the limit gets its own shard."""
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for key, tensor in state_dict.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(key)
        shard_bytes += size
    return shards


# Copied from the source config on export: they belong to the tokenizer, not to the architecture.
_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def export_native_checkpoint(
    out_dir: str | os.PathLike,
    hf_state_dict: Mapping[str, torch.Tensor],
    config: dict,
    tokenizer_source_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_config: Mapping[str, Any] | None = None,
) -> list[Path]:
    """write_hf_checkpoint for a native model's export: config gets the tensors' dtype, the source
    checkpoint's token ids (when it has a config.json), then extra_config."""
    config["dtype"] = str(next(iter(hf_state_dict.values())).dtype).removeprefix("torch.")
    if tokenizer_source_dir is not None and (checkpoint_dir(tokenizer_source_dir) / CONFIG_FILE).is_file():
        source_config = read_hf_config(tokenizer_source_dir)
        config.update({key: source_config[key] for key in _TOKEN_ID_KEYS if key in source_config})
    config.update(extra_config or {})
    return write_hf_checkpoint(out_dir, hf_state_dict, config, source_dir=tokenizer_source_dir, max_shard_bytes=max_shard_bytes)


def write_hf_checkpoint(
    out_dir: str | os.PathLike,
    state_dict: Mapping[str, torch.Tensor],
    config: dict,
    source_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[Path]:
    """Write safetensors (sharded with an index when over max_shard_bytes), config.json, and the
    tokenizer files and generation_config.json found in source_dir. Returns the paths written.

    Safetensors files left in out_dir by an earlier export and not part of this one are removed
    last, so a reader never finds an index naming shards of two different exports.
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    shards = _plan_shards(state_dict, max_shard_bytes)
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for number, keys in enumerate(shards, start=1):
        filename = SINGLE_FILE if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {key: _plain_cpu_tensor(key, state_dict[key]) for key in keys}
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        with atomic_path(folder / filename) as tmp:
            # metadata format=pt: Transformers reads files without it as another framework's.
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        weight_map.update({key: filename for key in keys})
        written.append(folder / filename)
        del tensors
    if len(shards) > 1:
        atomic_write_json(folder / INDEX_FILE, {"metadata": {"total_size": total_bytes}, "weight_map": weight_map})
        written.append(folder / INDEX_FILE)
    atomic_write_json(folder / CONFIG_FILE, config)
    written.append(folder / CONFIG_FILE)
    if source_dir is not None:
        source = checkpoint_dir(source_dir)
        for name in (*TOKENIZER_FILES, GENERATION_CONFIG_FILE):
            if (source / name).is_file() and (source / name).resolve() != (folder / name).resolve():
                with atomic_path(folder / name) as tmp:
                    shutil.copyfile(source / name, tmp)
                written.append(folder / name)
    keep = {path.name for path in written}
    for stale in [*folder.glob("model*.safetensors"), folder / INDEX_FILE]:
        if stale.name not in keep and stale.is_file():
            stale.unlink()
    return written
