"""gla_chunk as of a git revision, importable next to the working tree's: for A/B timing in one process.

Before the split (issue 31) the kernel was one file, assay/kernels/gla.py; since, a package,
assay/kernels/gla/. Either is copied out of git into a temporary folder under its own name (a package's
`assay.kernels.gla.` imports rewritten to that name), so both versions run side by side; everything else
(assay.core) is shared.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def load_gla_chunk(rev: str):
    """gla_chunk as of git revision `rev`."""
    sha = _git("rev-parse", "--short", rev).strip()
    name = f"gla_at_{sha}"
    if name in sys.modules:
        return sys.modules[name].gla_chunk
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    files = _git("ls-tree", "-r", "--name-only", rev, "assay/kernels/gla/").split()
    if not files:  # the single-file layout
        (folder / f"{name}.py").write_text(_git("show", f"{rev}:assay/kernels/gla.py"))
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    else:
        package = folder / name
        package.mkdir()
        for path in files:
            source = re.sub(r"\bassay\.kernels\.gla\b", name, _git("show", f"{rev}:{path}"))
            (package / Path(path).name).write_text(source)
        sys.path.insert(0, str(folder))
        spec = importlib.util.spec_from_file_location(name, package / "__init__.py", submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.gla_chunk
