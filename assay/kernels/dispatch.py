"""Which implementation of a kernel runs for a call: forced for a block or a process (ASSAY_KERNEL_IMPL),
else the one the tensors' device maps to, redirected by a "fallback" size rule; an "error" rule refuses the call.
"""

from __future__ import annotations

import contextlib
import logging
import importlib
import os
from typing import Iterator, Mapping

import torch

from assay.core.errors import AssayError
from assay.kernels.definition import IMPLEMENTATIONS, Kernel

log = logging.getLogger("assay.kernels")

# Set to "torch" or "triton" to force one implementation on every device (TRITON_INTERPRET=1 makes
# Triton run on CPU tensors, slowly: that is how the Triton kernels are checked without a GPU).
IMPL_ENV = "ASSAY_KERNEL_IMPL"

_forced_impl: list[str] = []


@contextlib.contextmanager
def use_impl(impl: str) -> Iterator[None]:
    """Force one implementation ("torch" or "triton") for every kernel call in the block, process-wide."""
    if impl not in IMPLEMENTATIONS:
        raise AssayError(f"unknown kernel implementation {impl!r}; one of {', '.join(IMPLEMENTATIONS)}")
    _forced_impl.append(impl)
    try:
        yield
    finally:
        _forced_impl.pop()


def forced_impl() -> str | None:
    if _forced_impl:
        return _forced_impl[-1]
    impl = os.environ.get(IMPL_ENV, "").strip()
    if impl and impl not in IMPLEMENTATIONS:
        raise AssayError(f"{IMPL_ENV}={impl!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    return impl or None


def triton_available() -> bool:
    """Whether Triton imports here (an installed but broken one counts as absent)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def select_impl(kernel: Kernel, device: torch.device, tensors: Mapping[str, torch.Tensor]) -> str:
    """The implementation a call runs: forced (when the kernel has it), else the device's; a "fallback"
    constraint redirects it.

    Raises AssayError when the tensors break an "error" constraint.
    """
    forced = forced_impl()
    if forced == "triton" and "triton" in kernel.impls:
        impl = "triton"
    elif forced:  # "torch", or "triton" for a kernel that has no Triton implementation
        impl = kernel.impls[0]
    else:
        impl = kernel.device_impls.get(device.type, kernel.impls[0])
        if impl not in kernel.impls:  # the default {"cuda": "triton"} on a kernel without a Triton implementation
            impl = kernel.impls[0]
    if impl == "triton" and not triton_available():
        if forced == "triton":
            raise AssayError(f"{IMPL_ENV}=triton but Triton is not installed")
        _warn_once(f"{kernel.name}: Triton is not installed; running the {kernel.impls[0]} implementation on {device.type}")
        impl = kernel.impls[0]
    check_constraints(kernel, tensors, impl)
    for _ in range(len(kernel.constraints)):
        moved = [
            c.fallback for c in kernel.constraints
            if c.on_violation == "fallback" and c.impls and impl in c.impls and c.violated(tensors[c.argument])
        ]
        if not moved:
            break
        impl = moved[0]
        check_constraints(kernel, tensors, impl)
    return kernel.refine_impl(impl, tensors) if kernel.refine_impl else impl


def check_constraints(kernel: Kernel, tensors: Mapping[str, torch.Tensor], impl: str | None) -> None:
    """Raise AssayError when the tensors break an "error" constraint (of `impl`; impl=None: the ones binding all)."""
    for constraint in kernel.constraints:
        if constraint.on_violation != "error" or not (constraint.binds(impl) if impl else not constraint.impls):
            continue
        if constraint.violated(tensors[constraint.argument]):
            shape = tuple(tensors[constraint.argument].shape)
            raise AssayError(f"kernel {kernel.name}: {constraint.describe()}; got {constraint.argument} of shape {shape}")


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)
