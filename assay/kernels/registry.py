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

import contextlib
import fnmatch
import importlib
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import torch
from torch import nn

from assay.core.errors import AssayError

log = logging.getLogger("assay.kernels")

# name -> "module:attribute" of its Kernel definition. Registering a kernel is one line here.
KERNELS: dict[str, str] = {
    "rope": "assay.kernels.rope:KERNEL",
    "grouped_experts": "assay.kernels.grouped_experts:KERNEL",
    "attention": "assay.kernels.attention:KERNEL",
    "gla_chunk": "assay.kernels.gla_op:KERNEL",
}

# What a run can force: "torch" (a kernel's first, plain-PyTorch implementation) or "triton".
# Otherwise the implementation is chosen per call from the tensors' device (Kernel.device_impls).
IMPLEMENTATIONS = ("torch", "triton")
# Set to "torch" or "triton" to force one implementation on every device (TRITON_INTERPRET=1 makes
# Triton run on CPU tensors, slowly: that is how the Triton kernels are checked without a GPU).
IMPL_ENV = "ASSAY_KERNEL_IMPL"

# A module already swapped carries this attribute (the kernel's name): a second swap is refused.
_MARK = "_assay_kernel"


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


@dataclass(frozen=True, repr=False)
class Replacement:
    """One module swapped (or, in a dry run, that would be). Prints as its start-up log line does."""

    module: str
    kernel: str
    old_class: str
    new_class: str

    def __str__(self) -> str:
        return f"{self.module}: {self.old_class} -> {self.new_class} ({self.kernel})"

    __repr__ = __str__

    def as_dict(self) -> dict[str, str]:
        return {"module": self.module, "kernel": self.kernel, "old_class": self.old_class, "new_class": self.new_class}


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


# ------------------------------------------------------------------ which implementation runs


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
    try:
        import triton  # noqa: F401
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


# ------------------------------------------------------------------ applying kernels to a model


def _split_patterns(pattern: str | None) -> list[str]:
    if pattern is None:
        return []
    patterns = [p.strip() for p in pattern.split(",") if p.strip()]
    if not patterns:
        raise AssayError(f"kernel filter {pattern!r} holds no pattern")
    return patterns


def _selected(name: str, patterns: Sequence[str]) -> bool:
    """True when the module's name, or the name of a module containing it, matches a pattern."""
    if not patterns:
        return True
    parts = name.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes for pattern in patterns)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def apply_kernels(model: nn.Module, names: Sequence[str] | None, pattern: str | None = None, dry_run: bool = False) -> list[Replacement]:
    """Swap in the named kernels for the modules they target, within the modules `pattern` selects.

    names=None means every registered kernel that finds a module to replace. Refused with AssayError
    (and nothing changed): an unknown kernel name; a pattern that matches no module name; a kernel
    that finds no module of its target class in the selection (when named explicitly); two
    replacements of one module, or of a module and one inside it (also across calls).
    """
    explicit = names is not None
    requested = list(dict.fromkeys(names)) if names is not None else kernel_names()
    kernels = [get_kernel(name) for name in requested]
    patterns = _split_patterns(pattern)
    modules = dict(model.named_modules())
    modules.pop("", None)
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(name, pat) for name in modules):
            sample = ", ".join(list(modules)[:4])
            raise AssayError(f"kernel filter {pat!r} matches no module of {type(model).__name__} (names look like: {sample}, ...)")

    already = {name: getattr(module, _MARK) for name, module in modules.items() if hasattr(module, _MARK)}
    plan: dict[str, tuple[Kernel, nn.Module]] = {}
    for kernel in kernels:
        found = [
            name for name, module in modules.items()
            if isinstance(module, kernel.target) and _selected(name, patterns)
        ]
        if not found:
            if explicit:
                where = f" within {pattern!r}" if patterns else ""
                raise AssayError(f"kernel {kernel.name}: no {kernel.target.__name__} module{where} in this {type(model).__name__}")
            continue
        for name in found:
            if name in already:
                raise AssayError(f"{name} was already replaced by kernel {already[name]}; refusing a second replacement ({kernel.name})")
            if name in plan:
                raise AssayError(f"{name} would be replaced twice, by {plan[name][0].name} and by {kernel.name}")
            plan[name] = (kernel, modules[name])
    if not plan:
        where = f" within {pattern!r}" if patterns else ""
        raise AssayError(f"no registered kernel finds a module to replace{where} in this {type(model).__name__}")
    _refuse_nested(plan, already)

    replacements = []
    for name, (kernel, module) in plan.items():
        new_module = None if dry_run else _build(kernel, module)
        new_class = type(new_module).__name__ if new_module is not None else _replacement_class_name(kernel, module)
        replacements.append(Replacement(name, kernel.name, type(module).__name__, new_class))
        if new_module is not None:
            parent, child = _parent(model, name)
            setattr(parent, child, new_module)
    _ensure_log_visible()
    verb = "would replace" if dry_run else "replaced"
    for replacement in replacements:
        log.info("kernels: %s %s", verb, replacement)
    counts = Counter(r.kernel for r in replacements)
    log.info("kernels: %s %d module(s): %s", verb, len(replacements), ", ".join(f"{k} x{n}" for k, n in counts.items()))
    return replacements


def _ensure_log_visible() -> None:
    """The start-up lines must show in a plain `assay train`: when the application has configured no
    logging at all, this logger writes its INFO lines to stderr itself (a configuration, once made, wins)."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def _refuse_nested(plan: Mapping[str, tuple[Kernel, nn.Module]], already: Mapping[str, str]) -> None:
    """A replaced module inside another replaced one would be lost (or would hide the outer one)."""
    claimed = {name: kernel.name for name, (kernel, _) in plan.items()} | dict(already)
    for name in plan:
        for other, other_kernel in claimed.items():
            if other != name and (name.startswith(other + ".") or other.startswith(name + ".")):
                outer, inner = (other, name) if name.startswith(other + ".") else (name, other)
                raise AssayError(
                    f"{inner} ({claimed[inner]}) lies inside {outer} ({claimed[outer]}); "
                    "refusing two replacements on one module"
                )


def _build(kernel: Kernel, module: nn.Module) -> nn.Module:
    new_module = kernel.build(module)
    setattr(new_module, _MARK, kernel.name)
    return new_module


def _replacement_class_name(kernel: Kernel, module: nn.Module) -> str:
    cls = getattr(kernel.build, "__self__", None)
    return cls.__name__ if isinstance(cls, type) else kernel.build.__qualname__.split(".")[0]


def replaced_modules(model: nn.Module) -> dict[str, str]:
    """Module name -> kernel name of every module a kernel replaced."""
    return {name: getattr(module, _MARK) for name, module in model.named_modules() if hasattr(module, _MARK)}
