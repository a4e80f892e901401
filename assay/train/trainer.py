"""One trainer for every model path: next-token cross entropy, AdamW with warmup + cosine, the same
data and the same per-step metrics, on one process or a torchrun job (FSDP2 x TP on one DeviceMesh).

    result = train(TrainRequest(model="zoo/qwen3", path="native", steps=10, metrics=Path("run.jsonl")))

Order of a run: load the model (path) -> --check-init -> kernels -> parallelize -> compile blocks ->
optimizer -> resume -> steps (checkpoint every N) -> export. A NaN/inf loss or gradient norm stops
the run before the optimizer applies it (TrainingDiverged), so every checkpoint holds finite weights.

The request is assay.train.config, the --check-init probe assay.train.init_check, the result, summary
and metrics file assay.train.report, the export assay.train.export; their public names stay importable
from here.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import torch

from assay.core.device import memory_in_use_bytes, resolve_device
from assay.core.dtypes import DTYPE_NAMES, dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.core.files import reporting_disk_full
from assay.core.metrics import JsonlWriter, StepTimer, mfu
from assay.train import checkpoint as checkpoints
from assay.train import distributed
from assay.train.activation_checkpoint import apply_activation_checkpointing, checkpoint_wrapper
from assay.train.config import TrainRequest
from assay.train.crash_points import kill_point, kill_target
from assay.train.data import PackedBatches, load_texts, load_tokenizer, tokenize
from assay.train.export import export_hf
from assay.train.init_check import LOADED_LOSS_RATIO, CheckInit, check_init
from assay.train.loss import chunk_tokens_for, chunked_linear_cross_entropy, next_token_loss
from assay.train.model_paths import ModelChoice, apply_kernel_registry, load_model
from assay.train.optimization import build_optimizer, clip_grad_norm_tensor
from assay.train.report import TrainResult, metrics_writer, peak_flops, summarize

DTYPES = DTYPE_NAMES

__all__ = ["DTYPES", "LOADED_LOSS_RATIO", "CheckInit", "TrainRequest", "TrainResult", "Trainer", "TrainingDiverged",
           "check_init", "resolve_dtype", "train"]


class TrainingDiverged(Exception):
    """The loss or gradient norm became NaN/inf: the run stopped (exit 1), the last good checkpoint kept."""

    def __init__(self, message: str, step: int, last_checkpoint: Path | None):
        super().__init__(message)
        self.step = step
        self.last_checkpoint = last_checkpoint


def resolve_dtype(name: str) -> torch.dtype:
    if dtype_name(name, aliases=False) is None:
        raise AssayError(f"unknown --dtype {name!r} (one of {', '.join(DTYPES)})")
    return torch_dtype(name)


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
        request.validate()
        kill_target()  # a malformed test hook is an error now, not a silent no-op
        self.request = request
        self.dtype = resolve_dtype(request.training.dtype)
        world_size, _, local_rank = distributed.launched_world()
        self.device = distributed.place_device(resolve_device(request.training.device), local_rank, world_size)
        torch.manual_seed(request.training.seed)
        model = request.model
        choice = ModelChoice(model.checkpoint, model.path, model.flavour, model.overrides, model.allow_sliced_checkpoint, request.training.seed)
        self.loaded = load_model(choice, self.device, self.dtype)
        # Bad degrees are usage errors: reported before any process group exists, the same on every rank.
        self.loaded.check_parallel(request.parallelism.tp)
        dp_shard, tp = distributed.plan_layout(request.parallelism.dp_shard, request.parallelism.tp, world_size)
        self.layout = distributed.setup(self.device, dp_shard, tp)
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        request, loaded, layout = self.request, self.loaded, self.layout
        training = request.training
        if request.batch_source is not None:
            self.batches = request.batch_source
        else:
            tokenizer = load_tokenizer(loaded.checkpoint)
            tokens = tokenize(load_texts(request.data), tokenizer, loaded.vocab_size)
            self.batches = PackedBatches(tokens, training.seq_len, training.batch, training.seed, layout.dp_rank, layout.dp_shard)
        self.stopped: str | None = None  # why run() trains nothing (a failed check, a dry run)
        self.init_check: CheckInit | None = None
        self.kernels = None
        self.compile_stats = None
        if request.model.check_init:
            inputs, labels = self.batches.batch_for(0)
            self.init_check = check_init(loaded, inputs.to(self.device), labels.to(self.device), layout, training.seed)
            if not self.init_check.weights_loaded:
                self.stopped = "check-init: weights not loaded"
                return

        if request.kernels.requested:
            kernels = request.kernels
            names = list(kernels.names) if kernels.names else None
            replacements = apply_kernel_registry(loaded.model, names, kernels.filter, kernels.dry_run)
            self.kernels = [str(replacement) for replacement in replacements]
            if kernels.dry_run:
                self.stopped = "kernels dry run"
                return

        if layout.distributed:
            loaded.parallelize(layout.mesh, tp=layout.tp > 1, dp_shard=layout.dp_shard > 1)

        checkpointing = training.activation_checkpointing
        if request.compile.enabled:
            from assay.core.compiling import CompileStats, compile_modules

            self.compile_stats = CompileStats()
            # Per block, not the whole model: every layer reuses one graph, and FSDP's per-block
            # hooks stay outside the compiled region. Activation checkpointing is traced inside it.
            wrap = (lambda forward: checkpoint_wrapper(forward, checkpointing)) if checkpointing != "none" else None
            compile_modules(loaded.blocks(), request.compile.backend, self.compile_stats, wrap=wrap, mode=request.compile.mode)
        else:
            apply_activation_checkpointing(loaded.blocks(), checkpointing)

        self.optimizer, self.scheduler = build_optimizer(loaded.model, request.optim, training.steps)
        self.start_step = 0
        self.last_checkpoint: Path | None = None
        if request.checkpoint.resume:
            self._resume()

        tokens_per_rank = training.batch // max(layout.dp_shard, 1) * training.seq_len
        chunk = chunk_tokens_for(training.loss_chunk_tokens, tokens_per_rank, loaded.vocab_size)
        self.head_weight = loaded.output_weight() if chunk and not layout.distributed else None
        self.loss_chunk_tokens = chunk if self.head_weight is not None else 0
        shape = loaded.flop_shape
        self.flops_per_token = shape.train_flops_per_token(training.seq_len)  # the FLOP shape's own count (window layers at their window)
        self.peak_flops, self.peak_source = peak_flops(request.metrics.peak_flops, self.device, self.dtype) if layout.is_main else (None, "")
        self.timer = StepTimer(self.device, warmup_steps=request.metrics.timing_warmup_steps)
        self.records: list[dict] = []
        loaded.model.train()

    def _resume(self) -> None:
        """Model, optimizer, this rank's RNG, the LR schedule and the data position of the newest complete checkpoint."""
        request = self.request
        self.last_checkpoint = checkpoints.resume_point(request.checkpoint.folder, self.layout)
        saved = checkpoints.load_checkpoint(self.last_checkpoint, self.loaded.model, self.optimizer, self.layout)
        differences = [f"{key}: {saved.get('run', {}).get(key)!r} -> {value!r}"
                       for key, value in request.run_fingerprint().items() if saved.get("run", {}).get(key) != value]
        if differences:
            raise AssayError(f"--resume: {self.last_checkpoint} was written by a different run ({'; '.join(differences)})")
        self.start_step = int(saved["step"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if self.start_step >= request.training.steps:
            raise AssayError(f"{self.last_checkpoint} is at step {self.start_step}; --steps {request.training.steps} leaves nothing to train")
        if self.layout.is_main:  # on stderr: stdout stays the table or the --json document
            print(f"resumed from step {self.start_step} ({self.last_checkpoint}); training steps {self.start_step + 1}-"
                  f"{request.training.steps}", file=sys.stderr, flush=True)

    def step(self, step: int) -> dict:
        """Optimizer step number `step` (0-based); its record. TrainingDiverged on a NaN/inf loss or gradient."""
        loaded, layout, device = self.loaded, self.layout, self.device
        training = self.request.training
        self.timer.start()
        inputs, labels = self.batches.batch_for(step)
        inputs, labels = inputs.to(device), labels.to(device)
        if self.loss_chunk_tokens:
            loss = chunked_linear_cross_entropy(loaded.hidden_states(inputs), self.head_weight, labels, self.loss_chunk_tokens)
        else:
            loss = next_token_loss(loaded.logits(inputs), labels)
        loss.backward()
        kill_point("step", step + 1, layout.rank)  # test hook: gradients computed, weights not yet updated
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
        tokens = training.batch * training.seq_len
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
            self.request.checkpoint.folder, done, self.loaded.model, self.optimizer, state, self.layout, keep=self.request.checkpoint.keep
        )
        return self.last_checkpoint

    def run(self) -> TrainResult:
        request, layout = self.request, self.layout
        if self.stopped:
            return TrainResult([], {"stopped": self.stopped}, check_init=self.init_check, kernels=self.kernels, model=self.loaded)
        metrics_file = request.metrics.file
        writer = metrics_writer(metrics_file, self.start_step) if layout.is_main else JsonlWriter(None)
        from assay.core.compiling import watch
        from assay.core.progress import progress_bar

        steps, every, folder = request.training.steps, request.checkpoint.every, request.checkpoint.folder
        show_progress = request.metrics.progress and layout.is_main
        with progress_bar(f"train {self.loaded.path}", total=steps - self.start_step, enabled=show_progress) as advance:
            with watch(self.compile_stats) if self.compile_stats is not None else contextlib.nullcontext():
                for step in range(self.start_step, steps):
                    try:
                        record = self.step(step)
                    except TrainingDiverged as diverged:
                        with reporting_disk_full(f"--metrics {metrics_file}"):
                            writer.write({"step": diverged.step, "loss": None, "grad_norm": None, "stopped": str(diverged).split(":")[0]})
                        raise
                    with reporting_disk_full(f"--metrics {metrics_file}", kept=f"it holds the steps before step {step + 1}"):
                        writer.write(record)
                    advance(f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s")
                    done = step + 1
                    if folder is not None and ((every and done % every == 0) or done == steps):
                        self.save_checkpoint(done)

        exported = export_hf(self.loaded, request.checkpoint.export_hf, layout) if request.checkpoint.export_hf is not None else None
        summary = self.summary()
        summary |= {"checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None, "exported": str(exported) if exported else None}
        return TrainResult(
            self.records, summary, check_init=self.init_check, kernels=self.kernels, exported=exported,
            last_checkpoint=self.last_checkpoint, model=self.loaded,
        )

    def summary(self) -> dict:
        return summarize(self)

    def close(self) -> None:
        distributed.teardown(self.layout)
