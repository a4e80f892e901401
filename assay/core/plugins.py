"""Plugins: modules named in ASSAY_PLUGINS (comma-separated) are imported at start-up.

A vendor's compile backend or device registers itself when its module is imported; naming the module
here makes it available to `--backend NAME` in every assay process, probe workers included.
"""

from __future__ import annotations

import importlib
import os

from assay.core.errors import AssayError


def load_plugins() -> list[str]:
    names = [n.strip() for n in os.environ.get("ASSAY_PLUGINS", "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise AssayError(f"ASSAY_PLUGINS names {name!r}, which cannot be imported: {exc}") from None
    return names
