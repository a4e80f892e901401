"""`assay kernels check`: every registered kernel against its plain-PyTorch reference.

For each kernel, each of its check shapes (odd sizes among them) and each dtype (float32, bfloat16):
the kernel's outputs and the gradients of its inputs (one random output gradient, the same for all
runs) are compared with the same reference evaluated in float64 on the same input values:
max abs diff and relative error, against the ("kernel", dtype) tolerance of core.numerics. The
reference run in the checked dtype is compared with float64 too, as the yardstick. In float32 the
kernel is also compared with the PyTorch float32 reference directly: where the kernel does the same
arithmetic in the same order, that max abs diff is 0.0 (reported, not required: a GPU kernel that
fuses multiply-adds or reorders a sum differs by rounding). Inputs declared without gradient (the
rotary cache, the expert index) must receive none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from assay.core.device import resolve_device
from assay.core.numerics import compare, max_abs_diff
from assay.kernels.registry import Kernel, get_kernel, kernel_names, select_impl, use_impl

DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class CheckRow:
    kernel: str
    case: str
    dtype: str
    impl: str
    tensor: str  # "out q", "grad w1", "no grad cos"
    max_abs: float  # kernel vs float64 reference
    rel: float  # kernel vs float64 reference, ||a - r|| / ||r||
    reference_rel: float  # the PyTorch reference in this dtype vs float64 (the yardstick)
    max_abs_vs_torch: float | None  # float32 only: kernel vs the PyTorch float32 reference
    tol: float
    ok: bool


@dataclass
class CheckReport:
    device: str
    forced_impl: str | None
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def failures(self) -> list[CheckRow]:
        return [row for row in self.rows if not row.ok]

    def float32_max_abs_vs_torch(self) -> dict[str, float]:
        """Per kernel, the largest float32 kernel-vs-PyTorch difference over every shape and tensor."""
        worst: dict[str, float] = {}
        for row in self.rows:
            if row.max_abs_vs_torch is not None:
                worst[row.kernel] = max(worst.get(row.kernel, 0.0), row.max_abs_vs_torch)
        return worst

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "forced_impl": self.forced_impl,
            "ok": self.ok,
            "checks": len(self.rows),
            "failed": len(self.failures),
            "float32_max_abs_vs_torch": self.float32_max_abs_vs_torch(),
            "rows": [asdict(row) for row in self.rows],
        }


def _as_tuple(outputs: Any) -> tuple[torch.Tensor, ...]:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _prepare(kernel: Kernel, inputs: dict, dtype: torch.dtype | None, device: torch.device, track_no_grad: bool) -> dict:
    """Fresh leaves (cast to dtype when given), gradients on for grad_inputs (and, to prove none flows, no_grad_inputs)."""
    prepared = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            wants_grad = name in kernel.grad_inputs or (track_no_grad and name in kernel.no_grad_inputs and value.is_floating_point())
            value = value.clone().requires_grad_(wants_grad)
        prepared[name] = value
    return prepared


def _run(fn, kernel: Kernel, inputs: dict, grad_outputs: Sequence[torch.Tensor] | None, generator: torch.Generator | None = None):
    """Outputs and input gradients; with no grad_outputs given, draws them (and returns them too)."""
    outputs = _as_tuple(fn(**inputs))
    if grad_outputs is None:
        grad_outputs = [torch.randn(o.shape, generator=generator).to(o.device) for o in outputs]
    wrt = [inputs[name] for name in kernel.grad_inputs]
    grads = torch.autograd.grad(outputs, wrt, [g.to(o.dtype) for g, o in zip(grad_outputs, outputs)])
    return outputs, grads, grad_outputs


def _no_grad_flows(kernel: Kernel, fn, inputs: dict, grad_outputs) -> bool:
    watched = [inputs[name] for name in kernel.no_grad_inputs if isinstance(inputs[name], torch.Tensor) and inputs[name].requires_grad]
    if not watched:
        return True
    outputs = _as_tuple(fn(**inputs))
    grads = torch.autograd.grad(outputs, watched, [g.to(o.dtype) for g, o in zip(grad_outputs, outputs)], allow_unused=True)
    return all(g is None for g in grads)


def check_kernel(kernel: Kernel, device: torch.device, dtypes: Sequence[torch.dtype] = DTYPES, seed: int = 0) -> list[CheckRow]:
    rows = []
    for case_index, case in enumerate(kernel.cases):
        for dtype in dtypes:
            generator = torch.Generator().manual_seed(seed + case_index)
            base = kernel.make_inputs(case, dtype, generator)
            kernel_inputs = _prepare(kernel, base, None, device, track_no_grad=False)
            impl = select_impl(kernel, device, {k: v for k, v in kernel_inputs.items() if isinstance(v, torch.Tensor)})
            outputs, grads, grad_outputs = _run(kernel.function, kernel, kernel_inputs, None, generator)
            ref_outputs, ref_grads, _ = _run(kernel.reference, kernel, _prepare(kernel, base, None, device, False), grad_outputs)
            f64_outputs, f64_grads, _ = _run(
                kernel.reference, kernel, _prepare(kernel, base, torch.float64, device, False), [g.double() for g in grad_outputs]
            )
            named = [(f"out {name}", o, r, r64) for name, o, r, r64 in zip(kernel.outputs, outputs, ref_outputs, f64_outputs)]
            named += [(f"grad {name}", g, r, r64) for name, g, r, r64 in zip(kernel.grad_inputs, grads, ref_grads, f64_grads)]
            for label, actual, reference, reference64 in named:
                result = compare("kernel", actual, reference64, dtype)
                rows.append(CheckRow(
                    kernel=kernel.name, case=case.label, dtype=result.dtype, impl=impl, tensor=label,
                    max_abs=result.max_abs, rel=result.rel, reference_rel=compare("kernel", reference, reference64, dtype).rel,
                    max_abs_vs_torch=max_abs_diff(actual, reference) if dtype == torch.float32 else None,
                    tol=result.tol, ok=result.ok,
                ))
            if kernel.no_grad_inputs:
                clean = _no_grad_flows(kernel, kernel.function, _prepare(kernel, base, None, device, track_no_grad=True), grad_outputs)
                rows.append(CheckRow(
                    kernel=kernel.name, case=case.label, dtype=str(dtype).removeprefix("torch."), impl=impl,
                    tensor="no grad " + ", ".join(kernel.no_grad_inputs), max_abs=0.0, rel=0.0, reference_rel=0.0,
                    max_abs_vs_torch=None, tol=0.0, ok=clean,
                ))
    return rows


def check_kernels(
    names: Sequence[str] | None = None, device: str = "cpu", impl: str | None = None, dtypes: Sequence[torch.dtype] = DTYPES, seed: int = 0
) -> CheckReport:
    """Check the named kernels (all registered ones by default) on `device`; `impl` forces "torch" or "triton"."""
    target = resolve_device(device)
    report = CheckReport(device=str(target), forced_impl=impl)
    kernels = [get_kernel(name) for name in (names or kernel_names())]
    for kernel in kernels:
        if impl is None:
            report.rows.extend(check_kernel(kernel, target, dtypes, seed))
        else:
            with use_impl(impl):
                report.rows.extend(check_kernel(kernel, target, dtypes, seed))
    return report
