"""`assay plot run.jsonl -o run.png`: loss and throughput per step from a training metrics file."""

from __future__ import annotations

import json
from pathlib import Path

from assay.core.errors import AssayError
from assay.core.metrics import new_figure, read_jsonl, save_figure
from assay.train.records import phase_mfu, phase_tokens_per_s, steady_records, warmup_records


def read_training_records(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise AssayError(f"no metrics file at {path}")
    try:
        records = read_jsonl(path)
    except json.JSONDecodeError as error:
        raise AssayError(f"{path} is not JSON Lines: {error}") from None
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("step"), int) and r.get("loss") is not None]
    if not records:
        raise AssayError(f"{path} holds no training steps (objects with step and loss)")
    return records


def plot_metrics(metrics: str | Path, out: str | Path, title: str | None = None) -> Path:
    records = read_training_records(metrics)
    fig, axes = new_figure(ncols=2, size=(6.0, 4.0))
    loss_ax, speed_ax = axes[0]
    warm, steady = warmup_records(records), steady_records(records)

    loss_ax.plot([r["step"] for r in records], [r["loss"] for r in records], color="tab:blue", marker="o", markersize=3, label="loss")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss (next-token cross entropy)")
    loss_ax.set_title("loss")
    loss_ax.grid(alpha=0.3)

    throughput = [r for r in records if r.get("tokens_per_s") is not None]
    speed_ax.plot([r["step"] for r in throughput], [r["tokens_per_s"] for r in throughput], color="tab:green", marker="o", markersize=3, label="tokens/s")
    if warm:
        speed_ax.scatter([r["step"] for r in warm], [r["tokens_per_s"] for r in warm], color="tab:red", zorder=3, label="warm-up step")
    steady_speed = phase_tokens_per_s(steady)
    if steady_speed:
        speed_ax.axhline(steady_speed, color="tab:green", linestyle="--", alpha=0.6, label=f"steady {steady_speed:,.0f} (tokens / time)")
    speed_ax.set_xlabel("step")
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_ylim(bottom=0)
    steady_mfu = phase_mfu(steady)
    speed_ax.set_title("throughput" + (f" (steady MFU {100 * steady_mfu:.1f}%)" if steady_mfu is not None else ""))
    speed_ax.grid(alpha=0.3)
    speed_ax.legend(loc="best", fontsize=8, framealpha=0.85)
    fig.suptitle(title or Path(metrics).name)
    return save_figure(fig, out)
