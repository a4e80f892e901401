"""What a run reports: the result type, the per-step metrics file, the peak FLOP/s behind MFU, and the
summary (warm-up steps apart from the steady state)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from assay.core.device import device_name
from assay.core.errors import AssayError
from assay.core.files import atomic_write_text
from assay.core.metrics import JsonlWriter, lookup_peak_flops, measure_peak_flops, read_jsonl
from assay.train.init_check import CheckInit
from assay.train.model_paths import TrainModel
from assay.train.records import phase_mfu, phase_tokens_per_s, steady_records, warmup_records


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


def peak_flops(setting: str, device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s per device, where it came from) for --peak-flops auto | measure | a number."""
    if setting == "auto":
        peak = lookup_peak_flops(device_name(device), dtype)
        return peak, "table" if peak else "none (no table entry for this device; --peak-flops measure)"
    if setting == "measure":
        return measure_peak_flops(device, dtype), "measured matmul"
    try:
        return float(setting), "given"
    except ValueError:
        raise AssayError(f"--peak-flops {setting!r}: expected auto, measure or a number of FLOP/s") from None


def metrics_writer(path: Path | None, start_step: int) -> JsonlWriter:
    """A fresh file, or on resume the earlier run's lines up to the resumed step (later ones are redone)."""
    if path is None or start_step == 0 or not Path(path).is_file():
        return JsonlWriter(path, truncate=True)
    kept = [record for record in read_jsonl(path) if record.get("step", 0) <= start_step]
    atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in kept))
    return JsonlWriter(path, truncate=False)


def summarize(trainer) -> dict:
    """The run's summary from a Trainer: its request, model, layout and records."""
    request, loaded, layout, records = trainer.request, trainer.loaded, trainer.layout, trainer.records
    warm, steady = warmup_records(records), steady_records(records)
    total_params = sum(p.numel() for p in loaded.model.parameters())  # a DTensor counts its global size
    compile_stats = trainer.compile_stats
    return {
        "model": request.model.checkpoint, **loaded.describe(), "device": str(trainer.device), "device_name": device_name(trainer.device),
        "dtype": request.training.dtype, "world_size": layout.world_size, "dp_shard": layout.dp_shard, "tp": layout.tp,
        "batch": request.training.batch, "seq_len": request.training.seq_len, "steps_run": len(records),
        "first_step": records[0]["step"] if records else None, "last_step": records[-1]["step"] if records else None,
        "first_loss": records[0]["loss"] if records else None, "final_loss": records[-1]["loss"] if records else None,
        "warmup_steps": len(warm), "warmup_s": sum(r["step_s"] for r in warm), "warmup_tokens_per_s": phase_tokens_per_s(warm),
        "steady_steps": len(steady), "steady_step_s_mean": statistics.fmean(r["step_s"] for r in steady) if steady else None,
        "steady_tokens_per_s": phase_tokens_per_s(steady), "steady_mfu": phase_mfu(steady),
        "peak_memory_bytes": max((r["memory_bytes"] for r in records), default=None),
        "params_total": total_params, "active_matmul_params": loaded.flop_shape.active_matmul_params,
        "flops_per_token": trainer.flops_per_token, "peak_flops": trainer.peak_flops, "peak_flops_source": trainer.peak_source,
        "compile": compile_stats.as_dict() | {"backend": request.compile.backend, "mode": request.compile.mode} if compile_stats else None,
        "activation_checkpointing": request.training.activation_checkpointing, "loss_chunk_tokens": trainer.loss_chunk_tokens,
        "optimizer_implementation": getattr(trainer.optimizer, "implementation", None),
    }
