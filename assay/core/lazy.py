"""Package names that load on first use (PEP 562), so that importing a package's `commands` module for
`assay --help` does not import torch through the package's `__init__`.

    __getattr__ = lazy_exports(__name__, {"Engine": "assay.serve.engine", ...})
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `exports[name]` (a module path) and returns its `name`."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
