"""Step timing (warm-up apart from steady state), tokens/s, MFU, the JSONL writer and plots.

The FLOP-per-token formula lives here and only here: every model path and every system uses
`train_flops_per_token` / `forward_flops_per_token`.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from assay.core.device import synchronize
from assay.core.files import append_jsonl

# Dense peak FLOP/s per device name fragment and dtype, from vendors' data sheets (no sparsity).
# CPU has no entry: its peak depends on cores, clock and ISA, so it is measured (measure_peak_flops).
PEAK_FLOPS: dict[str, dict[torch.dtype, float]] = {
    "H200": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "H100": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "A100": {torch.bfloat16: 312e12, torch.float16: 312e12, torch.float32: 19.5e12},
    "L4": {torch.bfloat16: 121e12, torch.float16: 121e12, torch.float32: 30.3e12},
    "Trainium2": {torch.bfloat16: 667e12, torch.float16: 667e12, torch.float32: 181e12},
}


def lookup_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    for fragment, per_dtype in PEAK_FLOPS.items():
        if fragment.lower() in device_name.lower():
            return per_dtype.get(dtype)
    return None


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n x n matmul: the ceiling MFU is measured against where no table entry exists."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up: thread pools, allocator
    synchronize(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def forward_flops_per_token(active_matmul_params: int, n_layers: int, attention_width: int, seq_len: int) -> float:
    """2 FLOPs per multiply-add of every matmul weight a token passes, plus attention's two matmuls.

    Attention: QK^T and AV each cost 2 * width * seq_len per token per layer (PaLM's accounting,
    full square, not halved for causality). Linear-attention models pass attention_width=0 and count
    their state updates as matmul parameters.
    """
    return 2.0 * active_matmul_params + 4.0 * n_layers * attention_width * seq_len


def train_flops_per_token(active_matmul_params: int, n_layers: int, attention_width: int, seq_len: int) -> float:
    """Forward + backward = 3 x forward: 6N + 12 * layers * width * seq_len (PaLM appendix B)."""
    return 3.0 * forward_flops_per_token(active_matmul_params, n_layers, attention_width, seq_len)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    if not peak_flops:
        return None
    return tokens_per_s * flops_per_token / peak_flops


@dataclass
class StepTimer:
    """Wall time per step with the device synchronised; the first `warmup_steps` are kept apart.

    The first step of a compiled model includes compilation: it is reported, never averaged in.
    """

    device: torch.device | str = "cpu"
    warmup_steps: int = 1
    durations: list[float] = field(default_factory=list)
    _start: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def stop(self) -> float:
        synchronize(self.device)
        assert self._start is not None, "StepTimer.stop() without start()"
        elapsed = time.perf_counter() - self._start
        self.durations.append(elapsed)
        self._start = None
        return elapsed

    @property
    def last_is_warmup(self) -> bool:
        return len(self.durations) <= self.warmup_steps

    @property
    def warmup(self) -> list[float]:
        return self.durations[: self.warmup_steps]

    @property
    def steady(self) -> list[float]:
        return self.durations[self.warmup_steps :]

    def summary(self) -> dict:
        steady = self.steady
        return {
            "warmup_s": sum(self.warmup),
            "steady_mean_s": statistics.fmean(steady) if steady else None,
            "steady_median_s": statistics.median(steady) if steady else None,
            "steady_steps": len(steady),
        }


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class JsonlWriter:
    """One JSON object per line, each flushed and fsynced: a killed run keeps every finished record."""

    def __init__(self, path: str | Path | None, truncate: bool = True):
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if truncate:
                self.path.write_text("")

    def write(self, record: dict) -> None:
        if self.path is not None:
            append_jsonl(self.path, record)


def read_jsonl(path: str | Path) -> list[dict]:
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            records.append(json.loads(line))
    return records


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure to PNG atomically and close it."""
    from assay.core.files import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def new_figure(ncols: int = 1, nrows: int = 1, size=(6.0, 4.0)):
    """A figure on the non-interactive Agg backend (no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Constrained layout: axis labels and tick labels of neighbouring panels never overlap.
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, layout="constrained")
    return fig, axes
