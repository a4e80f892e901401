"""`assay kernels bench`: each registered kernel against its reference, forward and forward+backward.

Per kernel and benchmark shape: the wall time of the kernel's functional form (the custom operator
behind its layout wrapper, the implementation the device runs) and of the plain-PyTorch reference
the model uses without kernels; forward under no_grad, forward+backward with one output gradient.
Each is run `warmup` times (not counted: allocator, thread pools, first-call dispatch) then `repeats`
times; the median is reported and `speedup` = reference median / kernel median (> 1: kernel faster),
and the fastest run of each with its ratio (`speedup_best`): on a shared machine the fastest run is
the one least disturbed by other processes. Runs of the kernel and of the reference alternate, so a
load change hits both.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from assay.core.device import device_name, resolve_device
from assay.core.files import atomic_write_json
from assay.core.metrics import StepTimer
from assay.kernels.registry import Kernel, get_kernel, kernel_names, select_impl

MODES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class BenchRow:
    kernel: str
    case: str
    dtype: str
    mode: str
    impl: str
    kernel_ms: float  # medians
    reference_ms: float
    speedup: float  # reference_ms / kernel_ms
    kernel_best_ms: float  # fastest runs: on a shared machine, the ones least disturbed by other processes
    reference_best_ms: float
    speedup_best: float
    repeats: int


@dataclass
class BenchReport:
    device: str
    device_name: str
    torch: str
    threads: int
    warmup: int
    repeats: int
    stack_id: str = ""
    triton: str | None = None
    rows: list[BenchRow] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key != "rows"} | {"rows": [asdict(r) for r in self.rows]}


def _inputs(kernel: Kernel, base: dict, device: torch.device, with_grad: bool) -> dict:
    prepared = {}
    for name, value in base.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device).clone().requires_grad_(with_grad and name in kernel.grad_inputs)
        prepared[name] = value
    return prepared


def _as_tuple(outputs) -> tuple:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _step(fn, inputs: dict, mode: str, grad_outputs: Sequence[torch.Tensor] | None) -> None:
    if mode == "fwd":
        with torch.no_grad():
            fn(**inputs)
        return
    outputs = _as_tuple(fn(**inputs))
    torch.autograd.backward(outputs, list(grad_outputs))
    for value in inputs.values():
        if isinstance(value, torch.Tensor):
            value.grad = None


def bench_kernel(kernel: Kernel, device: torch.device, dtype: torch.dtype, warmup: int, repeats: int, seed: int = 0) -> list[BenchRow]:
    rows = []
    for case_index, case in enumerate(kernel.bench_cases or kernel.cases):
        generator = torch.Generator().manual_seed(seed + case_index)
        base = kernel.make_inputs(case, dtype, generator)
        for mode in MODES:
            with_grad = mode == "fwd+bwd"
            kernel_inputs = _inputs(kernel, base, device, with_grad)
            reference_inputs = _inputs(kernel, base, device, with_grad)
            impl = select_impl(kernel, device, {k: v for k, v in kernel_inputs.items() if isinstance(v, torch.Tensor)})
            grad_outputs = None
            if with_grad:
                with torch.no_grad():
                    shapes = [o.shape for o in _as_tuple(kernel.reference(**_inputs(kernel, base, device, False)))]
                grad_outputs = [torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for shape in shapes]
            timers = {"kernel": StepTimer(device, warmup_steps=warmup), "reference": StepTimer(device, warmup_steps=warmup)}
            for _ in range(warmup + repeats):
                for which, fn, inputs in (("kernel", kernel.function, kernel_inputs), ("reference", kernel.reference, reference_inputs)):
                    timers[which].start()
                    _step(fn, inputs, mode, grad_outputs)
                    timers[which].stop()
            kernel_s, reference_s = statistics.median(timers["kernel"].steady), statistics.median(timers["reference"].steady)
            kernel_best, reference_best = min(timers["kernel"].steady), min(timers["reference"].steady)
            rows.append(BenchRow(
                kernel=kernel.name, case=case.label, dtype=str(dtype).removeprefix("torch."), mode=mode, impl=impl,
                kernel_ms=kernel_s * 1e3, reference_ms=reference_s * 1e3, speedup=reference_s / kernel_s,
                kernel_best_ms=kernel_best * 1e3, reference_best_ms=reference_best * 1e3, speedup_best=reference_best / kernel_best,
                repeats=repeats,
            ))
    return rows


def bench_kernels(
    names: Sequence[str] | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32, warmup: int = 2, repeats: int = 7,
    seed: int = 0, out: str | Path | None = None,
) -> BenchReport:
    """Benchmark the named kernels (all registered ones by default); write the report as JSON to `out`."""
    from assay.core.stack import collect_stack, package_version

    target = resolve_device(device)
    report = BenchReport(
        device=str(target), device_name=device_name(target), torch=torch.__version__, threads=torch.get_num_threads(),
        warmup=warmup, repeats=repeats, stack_id=collect_stack(target.type, "eager").stack_id, triton=package_version("triton"),
    )
    for name in names or kernel_names():
        report.rows.extend(bench_kernel(get_kernel(name), target, dtype, warmup, repeats, seed))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, report.as_dict())
    return report
