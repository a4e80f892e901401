"""Swapping kernels into a model: module-name patterns select the modules, each kernel replaces the
modules of its target class, one start-up log line per replaced module. Refusals leave the model unchanged.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from torch import nn

from assay.core.errors import AssayError
from assay.kernels.definition import Kernel

log = logging.getLogger("assay.kernels")

# A module already swapped carries this attribute (the kernel's name): a second swap is refused.
_MARK = "_assay_kernel"


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


def swap_kernels(model: nn.Module, kernels: Sequence[Kernel], pattern: str | None, dry_run: bool, explicit: bool) -> list[Replacement]:
    """Swap in `kernels` for the modules they target, within the modules `pattern` selects (the
    registry's apply_kernels resolves the names). explicit: the kernels were named, so one that finds no
    module is refused rather than skipped."""
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
