"""One trainer for every model path: next-token cross entropy, AdamW with warmup + cosine, the same
data and the same per-step metrics, on one process or a torchrun job (FSDP2 x TP on one DeviceMesh).

    result = train(TrainRequest(model="zoo/qwen3", path="native", steps=10, metrics=Path("run.jsonl")))

Order of a run: load the model (path) -> --check-init -> kernels -> parallelize -> compile blocks ->
optimizer -> resume -> steps (checkpoint every N) -> export. A NaN/inf loss or gradient norm stops
the run before the optimizer applies it (TrainingDiverged), so every checkpoint holds finite weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from assay.core.device import device_name, memory_in_use_bytes, resolve_device
from assay.core.dtypes import DTYPE_NAMES, dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.core.files import atomic_write_text
from assay.core.metrics import JsonlWriter, StepTimer, lookup_peak_flops, measure_peak_flops, mfu, read_jsonl
from assay.train import checkpoint as checkpoints
from assay.train import distributed
from assay.train.activation_checkpoint import MODES as AC_MODES
from assay.train.activation_checkpoint import apply_activation_checkpointing, checkpoint_wrapper
from assay.train.data import BatchSource, DataSpec, PackedBatches, load_texts, load_tokenizer, tokenize
from assay.train.model_paths import ModelChoice, TrainModel, apply_kernel_registry, load_model
from assay.train.loss import chunk_tokens_for, chunked_linear_cross_entropy, next_token_loss
from assay.train.optimization import OptimConfig, build_optimizer, clip_grad_norm_tensor
from assay.train.records import phase_mfu, phase_tokens_per_s, steady_records, warmup_records

DTYPES = DTYPE_NAMES

# --check-init: loaded weights count as loaded when their first-step loss is at most this fraction of
# the lower of (random-init loss, ln(vocab)). Untrained weights sit at or above ln(vocab); the guide's
# published Qwen3 scored 6.54 against 12.43 random / 11.93 ln(vocab), i.e. 0.55 of it.
LOADED_LOSS_RATIO = 0.8


class TrainingDiverged(Exception):
    """The loss or gradient norm became NaN/inf: the run stopped (exit 1), the last good checkpoint kept."""

    def __init__(self, message: str, step: int, last_checkpoint: Path | None):
        super().__init__(message)
        self.step = step
        self.last_checkpoint = last_checkpoint


@dataclass(frozen=True)
class TrainRequest:
    model: str
    path: str = "native"
    flavour: str | None = None
    spec: str | None = None
    slice_experts: bool = False
    kernels: tuple[str, ...] | None = None
    kernels_filter: str | None = None
    kernels_dry_run: bool = False
    steps: int = 10
    batch: int = 4  # global batch (sequences per step over all data-parallel ranks)
    seq_len: int = 128
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    data: DataSpec = field(default_factory=DataSpec)
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    backend: str = "inductor"
    # torch.compile mode of the blocks (core.compiling.COMPILE_MODES, inductor only): "max-autotune-no-cudagraphs"
    # benchmarks GEMM choices at compile time (docs/training.md, "Third pass at --compile").
    compile_mode: str = "default"
    activation_checkpointing: str = "none"  # none | full | selective (assay.train.activation_checkpoint)
    # Tokens per chunk of the output-head loss (assay.train.loss): None chunks automatically when the
    # step's float32 logits pass 256 MiB, 0 never; single-process runs (FSDP's hooks run on forward()).
    loss_chunk_tokens: int | None = None
    dp_shard: int | None = None
    tp: int = 1
    metrics: Path | None = None
    export_hf: Path | None = None
    check_init: bool = False
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0  # 0: only at the end (when --checkpoint-dir is given)
    keep_checkpoints: int = 2
    resume: bool = False
    peak_flops: str = "auto"  # "auto" (table by device name), "measure", or FLOP/s as a number
    timing_warmup_steps: int = 1
    progress: bool = False
    # A synthetic token source (e.g. associative recall) in place of `data`: the same loop, optimizer and
    # metrics; its labels may hold IGNORE_INDEX. In-process callers only (not a CLI flag, not resumable
    # across processes unless the source is rebuilt the same way).
    batch_source: BatchSource | None = field(default=None, compare=False, repr=False)

    def run_fingerprint(self) -> dict:
        """What must match for --resume to continue this run exactly (--steps may change: a longer run)."""
        return {
            "model": str(Path(self.model).resolve()), "path": self.path, "flavour": self.flavour, "spec": self.spec,
            "slice_experts": self.slice_experts, "batch": self.batch, "seq_len": self.seq_len, "optim": asdict(self.optim),
            "seed": self.seed, "data": asdict(self.data), "dtype": self.dtype, "kernels": list(self.kernels or []),
            "kernels_filter": self.kernels_filter,
        }


@dataclass(frozen=True)
class CheckInit:
    loaded_loss: float
    random_loss: float
    ln_vocab: float
    weights_loaded: bool
    verdict: str


@dataclass
class TrainResult:
    records: list[dict]
    summary: dict
    check_init: CheckInit | None = None
    kernels: list[str] | None = None  # one line per replaced module (or planned, in a dry run)
    exported: Path | None = None
    last_checkpoint: Path | None = None
    model: TrainModel | None = field(default=None, repr=False)  # the trained model (in-process callers, tests)

    @property
    def losses(self) -> list[float]:
        return [record["loss"] for record in self.records]

    def as_dict(self) -> dict:
        return {
            "summary": self.summary,
            "check_init": asdict(self.check_init) if self.check_init else None,
            "kernels": self.kernels,
            "exported": str(self.exported) if self.exported else None,
            "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
            "records": self.records,
        }


def resolve_dtype(name: str) -> torch.dtype:
    if dtype_name(name, aliases=False) is None:
        raise AssayError(f"unknown --dtype {name!r} (one of {', '.join(DTYPES)})")
    return torch_dtype(name)


def check_init(loaded: TrainModel, inputs: torch.Tensor, labels: torch.Tensor, layout: distributed.Layout, seed: int) -> CheckInit:
    """First-step loss of the loaded weights vs a random init of the same architecture vs ln(vocab)."""
    if not loaded.has_checkpoint_weights:
        raise AssayError("--check-init compares the checkpoint's weights with random ones; a --flavour model has none")
    twin = loaded.random_twin(seed)
    with torch.no_grad():
        loaded_loss = float(distributed.mean_over_ranks(next_token_loss(loaded.logits(inputs), labels), layout))
        random_loss = float(distributed.mean_over_ranks(next_token_loss(twin.logits(inputs), labels), layout))
    del twin
    ln_vocab = math.log(loaded.vocab_size)
    threshold = LOADED_LOSS_RATIO * min(random_loss, ln_vocab)
    weights_loaded = loaded_loss <= threshold
    if weights_loaded:
        verdict = (
            f"weights loaded: first-step loss {loaded_loss:.3f} is far below random init {random_loss:.3f} "
            f"and ln(vocab) {ln_vocab:.3f}"
        )
    else:
        verdict = (
            f"weights NOT loaded (or untrained): first-step loss {loaded_loss:.3f} is not clearly below random init "
            f"{random_loss:.3f} / ln(vocab) {ln_vocab:.3f} (needs <= {threshold:.3f})"
        )
    return CheckInit(loaded_loss, random_loss, ln_vocab, weights_loaded, verdict)


def _peak_flops(setting: str, device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    if setting == "auto":
        peak = lookup_peak_flops(device_name(device), dtype)
        return peak, "table" if peak else "none (no table entry for this device; --peak-flops measure)"
    if setting == "measure":
        return measure_peak_flops(device, dtype), "measured matmul"
    try:
        return float(setting), "given"
    except ValueError:
        raise AssayError(f"--peak-flops {setting!r}: expected auto, measure or a number of FLOP/s") from None


def _validate(request: TrainRequest) -> None:
    if request.steps < 0:
        raise AssayError(f"--steps must be >= 0 (got {request.steps})")
    if request.checkpoint_every < 0:
        raise AssayError("--checkpoint-every must be >= 0")
    if request.checkpoint_every and request.checkpoint_dir is None:
        raise AssayError("--checkpoint-every needs --checkpoint-dir")
    if request.resume and request.checkpoint_dir is None:
        raise AssayError("--resume needs --checkpoint-dir")
    if request.timing_warmup_steps < 0:
        raise AssayError("--timing-warmup must be >= 0")
    if request.activation_checkpointing not in AC_MODES:
        raise AssayError(f"unknown --activation-checkpointing {request.activation_checkpointing!r} (one of {', '.join(AC_MODES)})")
    if request.loss_chunk_tokens is not None and request.loss_chunk_tokens < 0:
        raise AssayError("--loss-chunk-tokens must be >= 0 (0: the full logits)")
    if request.compile_mode != "default":
        from assay.core.compiling import mode_config_patches

        if not request.compile:
            raise AssayError(f"--compile-mode {request.compile_mode} needs --compile")
        mode_config_patches(request.backend, request.compile_mode)  # raises for an unknown mode or backend


def train(request: TrainRequest) -> TrainResult:
    """Run (or resume) one training job on this process's rank; returns what rank 0 should report."""
    trainer = Trainer(request)
    try:
        return trainer.run()
    finally:
        trainer.close()


class Trainer:
    """One job on this rank: __init__ sets everything up (model, checks, parallelism, compile, optimizer,
    resume), step() runs one optimizer step and returns its record, run() is the whole loop.

    step() is public so a benchmark can interleave two trainers step by step on a shared machine.
    """

    def __init__(self, request: TrainRequest):
        _validate(request)
        self.request = request
        self.dtype = resolve_dtype(request.dtype)
        world_size, _, local_rank = distributed.launched_world()
        self.device = distributed.place_device(resolve_device(request.device), local_rank, world_size)
        torch.manual_seed(request.seed)
        choice = ModelChoice(request.model, request.path, request.flavour, request.spec, request.slice_experts, request.seed)
        self.loaded = load_model(choice, self.device, self.dtype)
        # Bad degrees are usage errors: reported before any process group exists, the same on every rank.
        self.loaded.check_parallel(request.tp)
        dp_shard, tp = distributed.plan_layout(request.dp_shard, request.tp, world_size)
        self.layout = distributed.setup(self.device, dp_shard, tp)
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        request, loaded, layout = self.request, self.loaded, self.layout
        if request.batch_source is not None:
            self.batches = request.batch_source
        else:
            tokenizer = load_tokenizer(loaded.checkpoint)
            tokens = tokenize(load_texts(request.data), tokenizer, loaded.vocab_size)
            self.batches = PackedBatches(tokens, request.seq_len, request.batch, request.seed, layout.dp_rank, layout.dp_shard)
        self.stopped: str | None = None  # why run() trains nothing (a failed check, a dry run)
        self.init_check: CheckInit | None = None
        self.kernels = None
        self.compile_stats = None
        if request.check_init:
            inputs, labels = self.batches.batch_for(0)
            self.init_check = check_init(loaded, inputs.to(self.device), labels.to(self.device), layout, request.seed)
            if not self.init_check.weights_loaded:
                self.stopped = "check-init: weights not loaded"
                return

        if request.kernels is not None or request.kernels_filter is not None or request.kernels_dry_run:
            if loaded.path != "native":
                raise AssayError("--kernels replaces modules of the native model; use it with --path native")
            names = list(request.kernels) if request.kernels else None
            replacements = apply_kernel_registry(loaded.model, names, request.kernels_filter, request.kernels_dry_run)
            self.kernels = [str(replacement) for replacement in replacements]
            if request.kernels_dry_run:
                self.stopped = "kernels dry run"
                return

        if layout.distributed:
            loaded.parallelize(layout.mesh, tp=layout.tp > 1, dp_shard=layout.dp_shard > 1)

        checkpointing = request.activation_checkpointing
        if request.compile:
            from assay.core.compiling import CompileStats, compile_modules

            self.compile_stats = CompileStats()
            # Per block, not the whole model: every layer reuses one graph, and FSDP's per-block
            # hooks stay outside the compiled region. Activation checkpointing is traced inside it.
            wrap = (lambda forward: checkpoint_wrapper(forward, checkpointing)) if checkpointing != "none" else None
            compile_modules(loaded.blocks(), request.backend, self.compile_stats, wrap=wrap, mode=request.compile_mode)
        else:
            apply_activation_checkpointing(loaded.blocks(), checkpointing)

        self.optimizer, self.scheduler = build_optimizer(loaded.model, request.optim, request.steps)
        self.start_step = 0
        self.last_checkpoint: Path | None = None
        if request.resume:
            self.last_checkpoint = checkpoints.resume_point(request.checkpoint_dir, layout)
            saved = checkpoints.load_checkpoint(self.last_checkpoint, loaded.model, self.optimizer, layout)
            _check_same_run(saved.get("run", {}), request.run_fingerprint(), self.last_checkpoint)
            self.start_step = int(saved["step"])
            self.scheduler.load_state_dict(saved["scheduler"])
            if self.start_step >= request.steps:
                raise AssayError(f"{self.last_checkpoint} is at step {self.start_step}; --steps {request.steps} leaves nothing to train")

        tokens_per_rank = request.batch // max(layout.dp_shard, 1) * request.seq_len
        chunk = chunk_tokens_for(request.loss_chunk_tokens, tokens_per_rank, loaded.vocab_size)
        self.head_weight = loaded.output_weight() if chunk and not layout.distributed else None
        self.loss_chunk_tokens = chunk if self.head_weight is not None else 0
        shape = loaded.flop_shape
        self.flops_per_token = shape.train_flops_per_token(request.seq_len)  # the FLOP shape's own count (window layers at their window)
        self.peak_flops, self.peak_source = _peak_flops(request.peak_flops, self.device, self.dtype) if layout.is_main else (None, "")
        self.timer = StepTimer(self.device, warmup_steps=request.timing_warmup_steps)
        self.records: list[dict] = []
        loaded.model.train()

    def step(self, step: int) -> dict:
        """Optimizer step number `step` (0-based); its record. TrainingDiverged on a NaN/inf loss or gradient."""
        loaded, layout, device = self.loaded, self.layout, self.device
        self.timer.start()
        inputs, labels = self.batches.batch_for(step)
        inputs, labels = inputs.to(device), labels.to(device)
        if self.loss_chunk_tokens:
            loss = chunked_linear_cross_entropy(loaded.hidden_states(inputs), self.head_weight, labels, self.loss_chunk_tokens)
        else:
            loss = next_token_loss(loaded.logits(inputs), labels)
        loss.backward()
        grad_norm_t = clip_grad_norm_tensor(loaded.model.parameters(), self.request.optim.grad_clip)
        global_loss_t = distributed.mean_over_ranks(loss.detach(), layout)
        # One device-to-host read per step for both metrics (each float() would wait for the device).
        global_loss, grad_norm = torch.stack([global_loss_t.float(), grad_norm_t.to(global_loss_t.device)]).tolist()
        lr = self.scheduler.get_last_lr()[0]
        if not (math.isfinite(global_loss) and math.isfinite(grad_norm)):
            self.timer.stop()
            what = f"loss is {global_loss}" if not math.isfinite(global_loss) else f"gradient norm is {grad_norm}"
            kept = f"last good checkpoint: {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint was written"
            raise TrainingDiverged(f"{what} at step {step + 1}: training stopped; {kept}", step + 1, self.last_checkpoint)
        self.optimizer.step()
        self.scheduler.step()
        memory_bytes = memory_in_use_bytes(device)
        self.optimizer.zero_grad(set_to_none=True)
        step_s = self.timer.stop()
        tokens = self.request.batch * self.request.seq_len
        tokens_per_s = tokens / step_s
        peak_all_ranks = self.peak_flops * layout.world_size if self.peak_flops else None
        record = {
            "step": step + 1, "loss": global_loss, "grad_norm": grad_norm, "lr": lr, "tokens": tokens,
            "tokens_seen": self.batches.tokens_consumed(step + 1), "step_s": step_s, "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, peak_all_ranks), "memory_bytes": memory_bytes,
            "warmup": self.timer.last_is_warmup,
        }
        self.records.append(record)
        return record

    def save_checkpoint(self, done: int) -> Path:
        state = {"run": self.request.run_fingerprint(), "scheduler": self.scheduler.state_dict(), "tokens_seen": self.batches.tokens_consumed(done)}
        self.last_checkpoint = checkpoints.save_checkpoint(
            self.request.checkpoint_dir, done, self.loaded.model, self.optimizer, state, self.layout, keep=self.request.keep_checkpoints
        )
        return self.last_checkpoint

    def run(self) -> TrainResult:
        request, layout = self.request, self.layout
        if self.stopped:
            return TrainResult([], {"stopped": self.stopped}, check_init=self.init_check, kernels=self.kernels, model=self.loaded)
        writer = _metrics_writer(request.metrics, self.start_step) if layout.is_main else JsonlWriter(None)
        from assay.core.compiling import watch
        from assay.core.progress import progress_bar

        show_progress = request.progress and layout.is_main
        with progress_bar(f"train {self.loaded.path}", total=request.steps - self.start_step, enabled=show_progress) as advance:
            with watch(self.compile_stats) if self.compile_stats is not None else contextlib.nullcontext():
                for step in range(self.start_step, request.steps):
                    try:
                        record = self.step(step)
                    except TrainingDiverged as diverged:
                        writer.write({"step": diverged.step, "loss": None, "grad_norm": None, "stopped": str(diverged).split(":")[0]})
                        raise
                    writer.write(record)
                    advance(f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s")
                    done = step + 1
                    every = request.checkpoint_every
                    if request.checkpoint_dir is not None and ((every and done % every == 0) or done == request.steps):
                        self.save_checkpoint(done)

        exported = _export(self.loaded, request.export_hf, layout) if request.export_hf is not None else None
        summary = self.summary()
        summary |= {"checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None, "exported": str(exported) if exported else None}
        return TrainResult(
            self.records, summary, check_init=self.init_check, kernels=self.kernels, exported=exported,
            last_checkpoint=self.last_checkpoint, model=self.loaded,
        )

    def summary(self) -> dict:
        request, loaded, layout, records = self.request, self.loaded, self.layout, self.records
        warm, steady = warmup_records(records), steady_records(records)
        total_params = sum(p.numel() for p in loaded.model.parameters())  # a DTensor counts its global size
        return {
            "model": request.model, **loaded.describe(), "device": str(self.device), "device_name": device_name(self.device),
            "dtype": request.dtype, "world_size": layout.world_size, "dp_shard": layout.dp_shard, "tp": layout.tp,
            "batch": request.batch, "seq_len": request.seq_len, "steps_run": len(records),
            "first_step": records[0]["step"] if records else None, "last_step": records[-1]["step"] if records else None,
            "first_loss": records[0]["loss"] if records else None, "final_loss": records[-1]["loss"] if records else None,
            "warmup_steps": len(warm), "warmup_s": sum(r["step_s"] for r in warm), "warmup_tokens_per_s": phase_tokens_per_s(warm),
            "steady_steps": len(steady), "steady_step_s_mean": statistics.fmean(r["step_s"] for r in steady) if steady else None,
            "steady_tokens_per_s": phase_tokens_per_s(steady), "steady_mfu": phase_mfu(steady),
            "peak_memory_bytes": max((r["memory_bytes"] for r in records), default=None),
            "params_total": total_params, "active_matmul_params": loaded.flop_shape.active_matmul_params,
            "flops_per_token": self.flops_per_token, "peak_flops": self.peak_flops, "peak_flops_source": self.peak_source,
            "compile": self.compile_stats.as_dict() | {"backend": request.backend, "mode": request.compile_mode} if self.compile_stats else None,
            "activation_checkpointing": request.activation_checkpointing, "loss_chunk_tokens": self.loss_chunk_tokens,
            "optimizer_implementation": getattr(self.optimizer, "implementation", None),
        }

    def close(self) -> None:
        distributed.teardown(self.layout)


def _metrics_writer(path: Path | None, start_step: int) -> JsonlWriter:
    """A fresh file, or on resume the earlier run's lines up to the resumed step (later ones are redone)."""
    if path is None or start_step == 0 or not Path(path).is_file():
        return JsonlWriter(path, truncate=True)
    kept = [record for record in read_jsonl(path) if record.get("step", 0) <= start_step]
    atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in kept))
    return JsonlWriter(path, truncate=False)


def _check_same_run(saved: dict, current: dict, where: Path) -> None:
    differences = [f"{key}: {saved.get(key)!r} -> {current[key]!r}" for key in current if saved.get(key) != current[key]]
    if differences:
        raise AssayError(f"--resume: {where} was written by a different run ({'; '.join(differences)})")


def _export(loaded: TrainModel, out_dir: Path, layout: distributed.Layout) -> Path | None:
    """Gather the full weights (a collective under FSDP/TP) and write them from rank 0."""
    if layout.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(loaded.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = {key: tensor.detach() for key, tensor in loaded.model.state_dict().items()}
    if layout.is_main:
        loaded.export(Path(out_dir), state)
    distributed.barrier(layout)
    return Path(out_dir)
