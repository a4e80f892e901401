"""gla_chunk as of a git revision, importable next to the working tree's: for A/B timing in one process.

Before the split (issue 31) the kernel was one file, assay/kernels/gla.py; since, a package,
assay/kernels/gla/. Either is copied out of git into a temporary folder under its own name (a package's
`assay.kernels.gla.` imports rewritten to that name), so both versions run side by side; everything else
(assay.core) is shared. Files read from git are kept under .rev/<revision>/ in the repository (ignored):
a copy of the working tree without .git (the device machine's) runs the revisions found there.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def _kernel_files(rev: str) -> dict[str, str]:
    """{path: source} of the GLA kernel at `rev`, from .rev/<rev>/ when kept there, else from git (then kept)."""
    kept = REPO / ".rev" / rev
    if kept.is_dir():
        return {path.relative_to(kept).as_posix(): path.read_text() for path in sorted(kept.rglob("*.py"))}
    paths = _git("ls-tree", "-r", "--name-only", rev, "assay/kernels/gla/").split() or ["assay/kernels/gla.py"]
    files = {path: _git("show", f"{rev}:{path}") for path in paths}
    for path, source in files.items():
        (kept / path).parent.mkdir(parents=True, exist_ok=True)
        (kept / path).write_text(source)
    return files


def load_gla_chunk(rev: str):
    """gla_chunk as of git revision `rev` (a name git knows, or one kept under .rev/)."""
    name = f"gla_at_{re.sub(r'[^0-9A-Za-z]', '_', rev)}"
    if name in sys.modules:
        return sys.modules[name].gla_chunk
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    files = _kernel_files(rev)
    if list(files) == ["assay/kernels/gla.py"]:  # the single-file layout
        (folder / f"{name}.py").write_text(files["assay/kernels/gla.py"])
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    else:
        package = folder / name
        package.mkdir()
        for path, source in files.items():
            (package / Path(path).name).write_text(re.sub(r"\bassay\.kernels\.gla\b", name, source))
        sys.path.insert(0, str(folder))
        spec = importlib.util.spec_from_file_location(name, package / "__init__.py", submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.gla_chunk
