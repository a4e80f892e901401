"""The architecture registry: one entry per native architecture, found by a checkpoint's model_type.

torchtitan's model specs and vLLM's model registry in one: everything that differs by architecture is
answered by its ArchSpec, so train, serve, recall and the zoo never ask "which architecture is this?".

    spec = for_config(read_hf_config("zoo/llama"))           # or get("llama"), or for_model_type("qwen3_moe")
    model, args = spec.load("zoo/llama", device="cpu", dtype=torch.float32)
    spec.export_hf(model.state_dict(), args, "out/", "zoo/llama")

Each models/<arch>/__init__.py ends with one `register(ArchSpec(...))` naming its parts (args class,
model class, key-map adapter, TP plan); load, export, build, parallelize and the FLOP count derive from
them. The packages below are imported on the first lookup (vLLM's lazy registry: a name and where it
lives), so importing this module stays cheap and a model never imports another.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models import ARCH_PACKAGES
from assay.models.slots import DecodeMemory, SlotModel

# Where the built-in entries live: ARCH_PACKAGES (assay/models/__init__.py, torch-free there so that --help
# texts can name them). Adding an architecture: a folder, its register(...) call, one line there.


@dataclass(frozen=True)
class FlopShape:
    """What core.metrics.train_flops_per_token needs: active matmul weights per token, layers, attention width.

    window_layers: the sliding-window layers as (count, window) pairs, counted among n_layers; each
    attends to min(seq_len, window) positions instead of seq_len."""

    active_matmul_params: int
    n_layers: int
    attention_width: int  # 0 for a recurrence (its cost does not grow with the context)
    window_layers: tuple[tuple[int, int], ...] = ()

    def train_flops_per_token(self, seq_len: int) -> float:
        from assay.core.metrics import train_flops_per_token

        # The attention term is linear in layers x context: full layers at seq_len, window layers at their window.
        full_layers = self.n_layers - sum(count for count, _ in self.window_layers)
        flops = train_flops_per_token(self.active_matmul_params, full_layers, self.attention_width, seq_len)
        for count, window in self.window_layers:
            flops += train_flops_per_token(0, count, self.attention_width, min(seq_len, window))
        return flops


@dataclass(frozen=True)
class ArchSpec:
    """One native architecture: everything a system needs to load, build, train, export and serve it,
    derived from the folder's parts (args class, model class, key-map adapter, TP plan)."""

    name: str  # "qwen3", "gla", "llama": the folder under assay/models and what results call it
    label: str  # for people: "attention (Qwen3)", "GLA"
    model_types: tuple[str, ...]  # the HF config model_types this entry owns
    # the frozen args dataclass (assay.models.common.args.ModelArgs): from_hf_config, to_hf_config, with_overrides
    args_cls: type
    # the root module (assay.models.common.decoder.NativeDecoder): model_cls(args); build; from_state_dict
    model_cls: type[nn.Module]
    # the key map (assay.models.common.key_map.KeyMap): key_map_cls(args).to_hf / from_hf
    key_map_cls: type
    # (block, args) -> {module name in the block: TP} (assay.models.common.tp_plan), and args -> the sizes
    # tensor parallelism must divide (AssayError for what cannot be split at all)
    tp_plan: Callable[[nn.Module, Any], Mapping[str, Any]]
    tp_sizes: Callable[[Any], Mapping[str, int]]
    # decoding: how a sequence's history is kept (a growing KV cache or a fixed state), its slot model, its bytes
    cache: DecodeMemory
    # kernel name -> module-name pattern of the modules it replaces in this architecture
    kernel_targets: Mapping[str, str]
    # named sizes, {"tiny": args, ...}
    flavours: Mapping[str, Any] = field(default_factory=dict)
    # (vocab_size, dim, n_layers, n_heads, hidden_dim, max_seq_len) -> args at that size (recall's matched models)
    args_for_size: Callable[..., Any] | None = None

    # ---------------------------------------------------------------- derived, the same for every entry

    def args_from_hf(self, config: Mapping[str, Any]) -> Any:
        """config.json dict -> args (refuses, with the reason, what the model cannot run)."""
        return self.args_cls.from_hf_config(config)

    def apply_overrides(self, args: Any, overrides: str | Mapping[str, Any] | None) -> Any:
        """args with overrides ("layers=4,..." or a mapping, aliases allowed); None: args."""
        return args.with_overrides(overrides)

    def flavour(self, name: str) -> Any:
        try:
            return self.flavours[name]
        except KeyError:
            raise AssayError(f"unknown {self.args_cls.FAMILY} flavour {name!r}; known: {', '.join(self.flavours)}") from None

    def build(self, args: Any, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> nn.Module:
        """The model for args: shapes only on "meta", randomly initialised elsewhere."""
        return self.model_cls.build(args, device, dtype, seed)

    def to_hf(self, state_dict: Mapping[str, torch.Tensor], args: Any) -> dict[str, torch.Tensor]:
        return self.key_map_cls(args).to_hf(state_dict)

    def from_hf(self, hf_state_dict: Mapping[str, torch.Tensor], args: Any, allow_sliced_checkpoint: bool = False) -> dict[str, torch.Tensor]:
        return self.key_map_cls(args).from_hf(hf_state_dict, allow_sliced_checkpoint=allow_sliced_checkpoint)

    def load(self, folder: str | os.PathLike, overrides: str | Mapping[str, Any] | None = None, allow_sliced_checkpoint: bool = False,
             device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        """The native model the checkpoint's config.json describes (after overrides), with its weights:
        safetensors read lazily (one file or sharded), renamed by the key map, placed on device in dtype.

        allow_sliced_checkpoint (the trainer's --allow-sliced-checkpoint): allow args smaller than the checkpoint (its first
        layers; for a mixture of experts also its first experts and router rows).
        """
        from assay.models.hf_checkpoint import SafetensorsStateDict, checkpoint_dir, read_hf_config

        path = checkpoint_dir(folder)
        args = self.apply_overrides(self.args_from_hf(read_hf_config(path)), overrides)
        native = self.from_hf(SafetensorsStateDict(path), args, allow_sliced_checkpoint)
        return self.model_cls.from_state_dict(args, native, device, dtype, self.args_cls.FAMILY), args

    def export_hf(self, model: nn.Module | Mapping[str, torch.Tensor], args: Any, out_dir: str | os.PathLike,
                  tokenizer_source_dir: str | os.PathLike | None = None, max_shard_bytes: int | None = None,
                  extra_config: Mapping[str, Any] | None = None) -> list:
        """A checkpoint folder AutoModelForCausalLM.from_pretrained reloads: safetensors under the key map's
        names, args.to_hf_config(), and from the source checkpoint its tokenizer files, generation_config.json
        and token ids. `model` is a native model or its full (gathered, plain-tensor) state dict;
        extra_config: further config.json fields (token ids when there is no source checkpoint)."""
        from assay.models.hf_checkpoint import DEFAULT_MAX_SHARD_BYTES, export_native_checkpoint

        state_dict = model.state_dict() if isinstance(model, nn.Module) else model
        return export_native_checkpoint(out_dir, self.to_hf(state_dict, args), args.to_hf_config(), tokenizer_source_dir,
                                        max_shard_bytes or DEFAULT_MAX_SHARD_BYTES, extra_config=extra_config)

    def parallelize(self, model: nn.Module, mesh, tp: bool, dp_shard: bool, mp_policy=None, reshard_after_forward: bool = True) -> nn.Module:
        """TP over mesh["tp"] (if tp), then FSDP2 over mesh["dp_shard"] (if dp_shard); in place."""
        from assay.models.parallel import parallelize_model

        return parallelize_model(model, mesh, tp, dp_shard, self.tp_plan, self.tp_sizes, mp_policy, reshard_after_forward)

    def check_tp(self, args: Any, tp: int) -> None:
        """AssayError when the sizes do not split tp ways (before any process group exists)."""
        if tp > 1:
            from assay.models.common.tp_plan import check_tp_sizes

            check_tp_sizes(self.tp_sizes(args), tp)

    def flop_shape(self, args: Any) -> FlopShape:
        """Counted on the meta device, so a sharded (or huge) model is counted whole. The attention term
        (PaLM's) counts for a model that attends over a KV cache, a sliding-window layer over its window;
        a fixed-state recurrence costs O(T) and counts its matmul weights only (6N per token, the usual
        convention for linear attention)."""
        from assay.models.common.counting import count_parameters

        counts = count_parameters(self.build(args, "meta"), top_k=getattr(args, "top_k", 0))
        if not self.cache.grows:
            return FlopShape(counts.active_matmul, args.n_layers, 0)
        windows = Counter(window for layer in range(args.n_layers) if (window := args.layer_window(layer)) is not None)
        return FlopShape(counts.active_matmul, args.n_layers, args.n_heads * args.head_dim, tuple(sorted((n, w) for w, n in windows.items())))

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks (compiled one by one, FSDP units)."""
        return list(model.layers)

    def flops_per_token(self, args: Any, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) at seq_len: the one formula, core.metrics."""
        return self.flop_shape(args).train_flops_per_token(seq_len)

    def state_bytes_per_sequence(self, args: Any, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
        """Decoding memory of one sequence of seq_len tokens: a KV cache grows with it (a window layer up to its
        window), a fixed state does not."""
        return self.cache.bytes_per_sequence(args, seq_len, dtype)

    def load_slot_model(self, folder: str | os.PathLike, device: torch.device, max_len: int) -> SlotModel:
        """The slot model (prefill into slots, decode a batch of slots) over the checkpoint's model."""
        from pathlib import Path

        return self.cache.slot_model.load(self, Path(folder), device, max_len)

    def wrap_slot_model(self, model: nn.Module, args: Any) -> SlotModel:
        """The slot model over an already loaded model."""
        return self.cache.slot_model(model, args, self.name)


_BY_NAME: dict[str, ArchSpec] = {}
_BY_MODEL_TYPE: dict[str, ArchSpec] = {}
_loaded = False


def register(spec: ArchSpec) -> ArchSpec:
    """Add an entry; refused when its name or one of its model_types is taken by another entry."""
    existing = _BY_NAME.get(spec.name)
    if existing is not None and existing is not spec:
        raise AssayError(f"an architecture named {spec.name!r} is already registered")
    for model_type in spec.model_types:
        owner = _BY_MODEL_TYPE.get(model_type)
        if owner is not None and owner.name != spec.name:
            raise AssayError(f"model_type {model_type!r} is already owned by the {owner.name} entry")
    _BY_NAME[spec.name] = spec
    _BY_MODEL_TYPE.update(dict.fromkeys(spec.model_types, spec))
    return spec


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        for package in ARCH_PACKAGES:
            importlib.import_module(package)  # each package's __init__ registers its entry
        _loaded = True


def names() -> list[str]:
    _ensure_loaded()
    return sorted(_BY_NAME)


def all_specs() -> list[ArchSpec]:
    _ensure_loaded()
    return [_BY_NAME[name] for name in sorted(_BY_NAME)]


def model_types() -> dict[str, ArchSpec]:
    _ensure_loaded()
    return dict(_BY_MODEL_TYPE)


def get(name: str) -> ArchSpec:
    _ensure_loaded()
    try:
        return _BY_NAME[name]
    except KeyError:
        raise AssayError(f"unknown architecture {name!r} (registered: {', '.join(sorted(_BY_NAME))})") from None


def find(model_type: str | None) -> ArchSpec | None:
    """The entry owning model_type, or None (the caller then takes Transformers' path)."""
    _ensure_loaded()
    return _BY_MODEL_TYPE.get(model_type or "")


def for_model_type(model_type: str | None) -> ArchSpec:
    spec = find(model_type)
    if spec is None:
        raise AssayError(f"no native model for model_type {model_type!r} (native: {', '.join(sorted(_BY_MODEL_TYPE))})")
    return spec


def for_config(config: Mapping[str, Any]) -> ArchSpec:
    """The entry for a config.json dict (AssayError when no entry owns its model_type)."""
    return for_model_type(config.get("model_type"))


def for_checkpoint(folder: str | os.PathLike) -> ArchSpec:
    from assay.models.hf_checkpoint import read_hf_config

    return for_config(read_hf_config(folder))
