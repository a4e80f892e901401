"""What a training run is asked to do: one typed request in sections (torchtitan's nested JobConfig habit).

    TrainRequest(model=ModelConfig("zoo/qwen3", path="hf"), training=TrainingConfig(steps=10))
    TrainRequest(model="zoo/qwen3", path="hf", steps=10)          # the same request, by the flags' names

Each section is a frozen dataclass with a docstring per field and `Literal` choices where a field takes
a fixed set of names. The flat keywords are the `assay train` flags' names (FLAT_FIELDS maps each one
to its section's field); a name no section owns is a TypeError, as for any dataclass. Reading a flat
name (`request.steps`) answers the section's field, so code written against the flat request keeps working.
`validate()` raises AssayError for every value a section cannot take, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from assay.core.errors import AssayError
from assay.train.data import BatchSource, DataSource
from assay.train.optimization import OptimConfig

ModelPath = Literal["native", "hf"]
ActivationCheckpointing = Literal["none", "full", "selective"]
CompileMode = Literal["default", "max-autotune-no-cudagraphs"]


@dataclass(frozen=True)
class ModelConfig:
    checkpoint: str
    """Checkpoint folder: config.json, weights and tokenizer (with `flavour`, only its tokenizer and config are read)."""
    path: ModelPath = "native"
    """`native`: assay's own model for the config's model_type (the architecture registry); `hf`: AutoModelForCausalLM."""
    flavour: str | None = None
    """Native only: a named size of the architecture (`tiny`, `0.6B`, ...), randomly initialised."""
    overrides: str | None = None
    """Native only: field overrides of the architecture's args, `layers=4,experts=8,top_k=2` (the --spec flag)."""
    allow_sliced_checkpoint: bool = False
    """Native only: load the first layers / experts of a larger checkpoint (with `overrides` asking for fewer)."""
    check_init: bool = False
    """Before training, compare the first batch's loss of the loaded weights with a random init and ln(vocab)."""


@dataclass(frozen=True)
class KernelsConfig:
    names: tuple[str, ...] | None = None
    """Kernel replacements (assay.kernels.registry names); None with a filter or dry run: every one that applies."""
    filter: str | None = None
    """fnmatch patterns over module names the replacements are limited to (`layers.0.*`)."""
    dry_run: bool = False
    """List the planned replacements and stop before training."""

    @property
    def requested(self) -> bool:
        return self.names is not None or self.filter is not None or self.dry_run


@dataclass(frozen=True)
class TrainingConfig:
    steps: int = 10
    """Total optimizer steps of the run (a resumed run continues to this step)."""
    batch: int = 4
    """Global batch: sequences per step over all data-parallel ranks."""
    seq_len: int = 128
    """Tokens per sequence."""
    seed: int = 0
    """Data order and random init."""
    device: str = "cpu"
    """Device type (one device per rank under torchrun)."""
    dtype: str = "float32"
    """The whole model's dtype (core.dtypes names)."""
    activation_checkpointing: ActivationCheckpointing = "none"
    """`full`: each block recomputed in backward; `selective`: matmul and attention outputs kept (assay.train.activation_checkpoint)."""
    loss_chunk_tokens: int | None = None
    """Tokens per chunk of the output-head loss (assay.train.loss): None chunks once the step's float32
    logits pass 256 MiB, 0 never; single-process runs (FSDP's hooks run on forward())."""


@dataclass(frozen=True)
class ParallelismConfig:
    dp_shard: int | None = None
    """FSDP2 degree; None: the processes launched / tp."""
    tp: int = 1
    """Tensor-parallel degree (native path)."""


@dataclass(frozen=True)
class CompileConfig:
    enabled: bool = False
    """torch.compile each transformer block (one compiled function per block class)."""
    backend: str = "inductor"
    """torch.compile backend name (`inductor`, `aot_eager`, `eager`, a vendor's)."""
    mode: CompileMode = "default"
    """`max-autotune-no-cudagraphs` benchmarks GEMM choices at compile time (inductor only)."""


@dataclass(frozen=True)
class CheckpointConfig:
    folder: Path | None = None
    """Where DCP checkpoints go (step-N folders); None: no checkpoints."""
    every: int = 0
    """Save every N steps; 0: only after the last step (when `folder` is set)."""
    keep: int = 2
    """The newest checkpoints kept."""
    resume: bool = False
    """Continue from the newest complete checkpoint in `folder`."""
    export_hf: Path | None = None
    """After the last step, write the trained model as a Transformers checkpoint folder here (replaced whole)."""


@dataclass(frozen=True)
class MetricsConfig:
    file: Path | None = None
    """JSONL, one object per step (rank 0 writes it)."""
    peak_flops: str = "auto"
    """MFU denominator per device: `auto` (core.metrics.PEAK_FLOPS by device name), `measure`, or FLOP/s as a number."""
    timing_warmup_steps: int = 1
    """First steps timed apart from the steady state (compilation, allocator warm-up)."""
    progress: bool = False
    """A progress bar on stderr (rank 0)."""


# Flat keyword (the `assay train` flag's name; `overrides` is the --spec flag's) -> (section, field). A section passed whole keeps its own name.
FLAT_FIELDS: dict[str, tuple[str, str]] = {
    "path": ("model", "path"), "flavour": ("model", "flavour"), "overrides": ("model", "overrides"),
    "allow_sliced_checkpoint": ("model", "allow_sliced_checkpoint"), "check_init": ("model", "check_init"),
    "kernels_filter": ("kernels", "filter"), "kernels_dry_run": ("kernels", "dry_run"),
    **{name: ("training", name) for name in ("steps", "batch", "seq_len", "seed", "device", "dtype", "activation_checkpointing", "loss_chunk_tokens")},
    "dp_shard": ("parallelism", "dp_shard"), "tp": ("parallelism", "tp"),
    "backend": ("compile", "backend"), "compile_mode": ("compile", "mode"),
    "checkpoint_dir": ("checkpoint", "folder"), "checkpoint_every": ("checkpoint", "every"),
    "keep_checkpoints": ("checkpoint", "keep"), "resume": ("checkpoint", "resume"), "export_hf": ("checkpoint", "export_hf"),
    "peak_flops": ("metrics", "peak_flops"), "timing_warmup_steps": ("metrics", "timing_warmup_steps"), "progress": ("metrics", "progress"),
}
# Flat names that are also a section's name: given as that section they are the section, given as anything
# else they are the section's main field (`compile=True`, `kernels=("rope",)`, `metrics=path`); `model` may be
# the checkpoint's path.
_SHORTHAND_FIELD = {"kernels": "names", "compile": "enabled", "metrics": "file"}


@dataclass(frozen=True, init=False)
class TrainRequest:
    """One training job. Sections: model, kernels, training, data, optim, parallelism, compile, checkpoint, metrics."""

    model: ModelConfig
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataSource = field(default_factory=DataSource)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    batch_source: BatchSource | None = field(default=None, compare=False, repr=False)
    """A synthetic token source (e.g. associative recall) in place of `data`: the same loop, optimizer and
    metrics; its labels may hold IGNORE_INDEX. In-process callers only (not a CLI flag; resumable only
    when the source is rebuilt the same way)."""

    def __init__(self, model: ModelConfig | str | Path, **given: Any):
        values: dict[str, Any] = {"model": model if isinstance(model, ModelConfig) else ModelConfig(str(model))}
        for f in fields(self):
            if f.name != "model":
                values[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        changes: dict[str, dict[str, Any]] = {}
        for name, value in given.items():
            if name in _SHORTHAND_FIELD and not isinstance(value, _SECTIONS[name]):
                changes.setdefault(name, {})[_SHORTHAND_FIELD[name]] = value
            elif name in values:
                values[name] = value
            elif name in FLAT_FIELDS:
                section, key = FLAT_FIELDS[name]
                changes.setdefault(section, {})[key] = value
            else:
                raise TypeError(f"TrainRequest got an unexpected keyword argument {name!r}")
        for section, updates in changes.items():
            values[section] = replace(values[section], **updates)
        if values["kernels"].names is not None:
            values["kernels"] = replace(values["kernels"], names=tuple(values["kernels"].names))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        """A flat name (`request.steps`) reads its section's field."""
        if name in FLAT_FIELDS:
            section, key = FLAT_FIELDS[name]
            return getattr(object.__getattribute__(self, section), key)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def validate(self) -> None:
        """AssayError for the first value no section can take (the CLI checked ranges already; in-process
        callers get the same messages)."""
        training, checkpoint, compile_config = self.training, self.checkpoint, self.compile
        if self.model.path not in get_args(ModelPath):
            raise AssayError(f"unknown --path {self.model.path!r} (one of {', '.join(get_args(ModelPath))})")
        if training.steps < 0:
            raise AssayError(f"--steps must be >= 0 (got {training.steps})")
        if checkpoint.every < 0:
            raise AssayError("--checkpoint-every must be >= 0")
        if checkpoint.every and checkpoint.folder is None:
            raise AssayError("--checkpoint-every needs --checkpoint-dir")
        if checkpoint.resume and checkpoint.folder is None:
            raise AssayError("--resume needs --checkpoint-dir")
        if self.metrics.timing_warmup_steps < 0:
            raise AssayError("--timing-warmup must be >= 0")
        if training.activation_checkpointing not in get_args(ActivationCheckpointing):
            choices = ", ".join(get_args(ActivationCheckpointing))
            raise AssayError(f"unknown --activation-checkpointing {training.activation_checkpointing!r} (one of {choices})")
        if training.loss_chunk_tokens is not None and training.loss_chunk_tokens < 0:
            raise AssayError("--loss-chunk-tokens must be >= 0 (0: the full logits)")
        if self.kernels.requested and self.model.path != "native":
            raise AssayError("--kernels replaces modules of the native model; use it with --path native")
        if compile_config.mode != "default":
            from assay.core.compiling import mode_config_patches

            if not compile_config.enabled:
                raise AssayError(f"--compile-mode {compile_config.mode} needs --compile")
            mode_config_patches(compile_config.backend, compile_config.mode)  # raises for an unknown mode or backend

    def run_fingerprint(self) -> dict:
        """What must match for --resume to continue this run exactly (--steps may change: a longer run)."""
        model, training = self.model, self.training
        # "spec" and "slice_experts": the keys checkpoints written before the rename hold, so they still resume.
        return {
            "model": str(Path(model.checkpoint).resolve()), "path": model.path, "flavour": model.flavour, "spec": model.overrides,
            "slice_experts": model.allow_sliced_checkpoint, "batch": training.batch, "seq_len": training.seq_len, "optim": asdict(self.optim),
            "seed": training.seed, "data": asdict(self.data), "dtype": training.dtype, "kernels": list(self.kernels.names or []),
            "kernels_filter": self.kernels.filter,
        }


_SECTIONS = {"kernels": KernelsConfig, "compile": CompileConfig, "metrics": MetricsConfig}
