"""The floating-point dtypes assay runs in, named once: the names a flag takes, their aliases, their width.

Each caller narrows the choice to what it supports (a slot pool stores float32 or bfloat16) and words its
own error; the names and bytes live here. Imports no torch at module level (the CLI imports this for --help).
"""

from __future__ import annotations

from typing import Sequence

# name -> bytes per element
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES = tuple(DTYPE_BYTES)
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_name(name: str, choices: Sequence[str] = DTYPE_NAMES, aliases: bool = True) -> str | None:
    """The canonical name of `name` (an alias resolved when aliases), or None unless it is one of choices."""
    canonical = ALIASES.get(name, name) if aliases else name
    return canonical if canonical in choices else None


def torch_dtype(name: str):
    """torch.float32 for "float32" (or an alias)."""
    import torch

    canonical = dtype_name(name)
    if canonical is None:
        raise ValueError(f"not a dtype assay runs in: {name!r}")
    return getattr(torch, canonical)
