"""The replacement registry: named kernels swapped into a model by module-name patterns.

One entry per kernel, one line each (vLLM's model registry habit: a name and where its definition
lives, imported on first use so that importing assay.kernels never imports a model):

    KERNELS["rope"] = "assay.kernels.rope:KERNEL"

A definition (`Kernel`) says which module class it replaces, how to build the replacement from the
module it replaces, its functional form and the plain-PyTorch reference that form must equal, the
shapes it is checked on, and its shape constraints (data, checked on every call). From Python:

    replacements = apply_kernels(model, ["rope", "grouped_experts"], pattern="layers.[0-3].*")

A pattern is an fnmatch glob over module names (`layers.*.attention`, `layers.0.*`; several
separated by commas); a module is selected when its name or the name of a module containing it
matches, so `layers.*.attention` selects each attention block and the rotary inside it. Start-up
logs one line per replaced module (logger "assay.kernels") and a count per kernel.
"""

from __future__ import annotations

import importlib
from typing import Sequence

from torch import nn

from assay.core.errors import AssayError

# The registry's parts, importable from here as before the split: definitions, the per-call choice of
# an implementation, the module swap.
from assay.kernels.definition import IMPLEMENTATIONS, Case, Kernel, ShapeConstraint
from assay.kernels.dispatch import IMPL_ENV, check_constraints, forced_impl, select_impl, triton_available, use_impl
from assay.kernels.swap import Replacement, replaced_modules, swap_kernels

__all__ = ["IMPLEMENTATIONS", "IMPL_ENV", "KERNELS", "Case", "Kernel", "Replacement", "ShapeConstraint", "all_kernels",
           "apply_kernels", "check_constraints", "forced_impl", "get_kernel", "kernel_names", "register_kernel",
           "replaced_modules", "select_impl", "triton_available", "unregister_kernel", "use_impl"]

# name -> "module:attribute" of its Kernel definition. Registering a kernel is one line here.
KERNELS: dict[str, str] = {
    "rope": "assay.kernels.rope:KERNEL",
    "grouped_experts": "assay.kernels.grouped_experts:KERNEL",
    "attention": "assay.kernels.attention:KERNEL",
    "gla_chunk": "assay.kernels.gla_op:KERNEL",
}

_loaded: dict[str, Kernel] = {}


def register_kernel(kernel: Kernel, replace: bool = False) -> Kernel:
    """Register a definition from Python (a kernel outside assay); the built-ins are in KERNELS."""
    if not replace and (kernel.name in _loaded or kernel.name in KERNELS) and _loaded.get(kernel.name) is not kernel:
        raise AssayError(f"a kernel named {kernel.name!r} is already registered")
    _loaded[kernel.name] = kernel
    return kernel


def unregister_kernel(name: str) -> None:
    """Forget a kernel registered from Python (tests, experiments); the built-ins stay."""
    _loaded.pop(name, None)


def kernel_names() -> list[str]:
    return sorted(set(KERNELS) | set(_loaded))


def get_kernel(name: str) -> Kernel:
    if name in _loaded:
        return _loaded[name]
    if name not in KERNELS:
        raise AssayError(f"unknown kernel {name!r}; registered: {', '.join(kernel_names())}")
    module_name, _, attribute = KERNELS[name].partition(":")
    kernel = getattr(importlib.import_module(module_name), attribute)
    if kernel.name != name:
        raise AssertionError(f"KERNELS[{name!r}] points at a definition named {kernel.name!r}")
    _loaded[name] = kernel
    return kernel


def all_kernels() -> list[Kernel]:
    return [get_kernel(name) for name in kernel_names()]


def apply_kernels(model: nn.Module, names: Sequence[str] | None, pattern: str | None = None, dry_run: bool = False) -> list[Replacement]:
    """Swap in the named kernels for the modules they target, within the modules `pattern` selects.

    names=None means every registered kernel that finds a module to replace. Refused with AssayError
    (and nothing changed): an unknown kernel name; a pattern that matches no module name; a kernel
    that finds no module of its target class in the selection (when named explicitly); two
    replacements of one module, or of a module and one inside it (also across calls).
    """
    requested = list(dict.fromkeys(names)) if names is not None else kernel_names()
    return swap_kernels(model, [get_kernel(name) for name in requested], pattern, dry_run, explicit=names is not None)
