"""What a kernel is: its definition (`Kernel`), the shapes it is checked on (`Case`) and its size rules
(`ShapeConstraint`). Data only: the name table is assay.kernels.registry, the per-call choice of an
implementation assay.kernels.dispatch, the module swap assay.kernels.swap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch
from torch import nn

# What a run can force: "torch" (a kernel's first, plain-PyTorch implementation) or "triton".
# Otherwise the implementation is chosen per call from the tensors' device (Kernel.device_impls).
IMPLEMENTATIONS = ("torch", "triton")


@dataclass(frozen=True)
class ShapeConstraint:
    """A size rule of a kernel, checked on every call before the kernel runs.

    `argument` names an input of the kernel's functional form and `dim` one of its dimensions.
    on_violation="error" raises AssayError; "fallback" runs the implementation `fallback` instead.
    `impls` lists the implementations the rule binds (all of them when empty).
    """

    argument: str
    dim: int
    why: str
    multiple_of: int = 1
    multiple_of_bytes: int = 0
    at_most: int | None = None
    impls: tuple[str, ...] = ()
    on_violation: Literal["error", "fallback"] = "error"
    fallback: str = ""

    def binds(self, impl: str | None) -> bool:
        return impl is None or not self.impls or impl in self.impls

    def violated(self, tensor: torch.Tensor) -> bool:
        size = tensor.shape[self.dim]
        if size % self.multiple_of:
            return True
        if self.multiple_of_bytes and (size * tensor.element_size()) % self.multiple_of_bytes:
            return True
        return self.at_most is not None and size > self.at_most

    def describe(self) -> str:
        rules = []
        if self.multiple_of > 1:
            rules.append(f"a multiple of {self.multiple_of}")
        if self.multiple_of_bytes:
            rules.append(f"a multiple of {self.multiple_of_bytes} bytes")
        if self.at_most is not None:
            rules.append(f"at most {self.at_most}")
        text = f"{self.argument}.shape[{self.dim}] must be {' and '.join(rules)} ({self.why})"
        if self.impls:
            text = f"[{', '.join(self.impls)}] " + text
        if self.on_violation == "fallback":
            text += f"; otherwise the {self.fallback} implementation runs"
        return text


@dataclass(frozen=True)
class Case:
    """One shape a kernel is checked (and benchmarked) on: sizes by name, and a label for tables."""

    label: str
    sizes: Mapping[str, int]


@dataclass(frozen=True)
class Kernel:
    """Everything the registry, `assay kernels check` and `assay kernels bench` need to know of a kernel.

    function and reference take the same keyword arguments (make_inputs' names) and return the same
    outputs (a tensor or a tuple, named by `outputs`). Gradients are checked for `grad_inputs`.
    `impls` names the implementations; the first runs on any device that `device_impls` does not name,
    and is the one `ASSAY_KERNEL_IMPL=torch` forces ("triton" forces the Triton one).
    """

    name: str
    summary: str
    target: type[nn.Module]
    build: Callable[[nn.Module], nn.Module]
    function: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[Case, torch.dtype, torch.Generator], dict[str, Any]]
    outputs: tuple[str, ...]
    grad_inputs: tuple[str, ...]
    cases: tuple[Case, ...]
    bench_cases: tuple[Case, ...] = ()
    constraints: tuple[ShapeConstraint, ...] = ()
    impls: tuple[str, ...] = IMPLEMENTATIONS
    # Which implementation runs where when nothing is forced; a device type not listed runs impls[0].
    device_impls: Mapping[str, str] = field(default_factory=lambda: {"cuda": "triton"})
    # Inputs that must not receive a gradient (a cache shared by every layer, an index).
    no_grad_inputs: tuple[str, ...] = ()
    # Last word on the implementation after the constraints (e.g. a device that lacks an operator).
    refine_impl: Callable[[str, Mapping[str, torch.Tensor]], str] | None = None
