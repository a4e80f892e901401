"""Compile caches by stack: where they live, export/import as an archive, per-model mega-cache files.

A cache is reusable only by the same compiler: the archive's manifest records the versions that must
match (torch, triton, the vendor compiler, Python, device type), and import refuses any other stack.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from assay.core.errors import AssayError
from assay.core.files import atomic_path

MANIFEST = "assay-cache-manifest.json"
MEGA_FOLDER = "assay-mega-cache"


def default_cache_dir() -> Path:
    """The inductor cache folder this process uses (TORCHINDUCTOR_CACHE_DIR or torch's default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def cache_env(cache_dir: str | Path) -> dict[str, str]:
    """Environment that points a child process's compile caches at `cache_dir`."""
    cache_dir = Path(cache_dir).resolve()
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TRITON_CACHE_DIR": str(cache_dir / "triton")}


def compiler_fingerprint(device_type: str = "cpu") -> dict:
    """What must match for compiled graphs to be reused."""
    import platform

    from assay.core.stack import package_version

    import torch

    return {
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "neuronx-cc": package_version("neuronx-cc"),
        "python": ".".join(platform.python_version().split(".")[:2]),
        "device_type": device_type,
        "machine": platform.machine(),
    }


def export_cache(archive: str | Path, cache_dir: str | Path | None = None, device_type: str = "cpu") -> dict:
    from assay.core.checks import check_output_file

    check_output_file("ARCHIVE", archive)  # before the cache is walked and compressed
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    if not cache_dir.is_dir():
        raise AssayError(f"no compile cache at {cache_dir} (nothing compiled yet, or a wrong --cache-dir)")
    manifest = {"kind": "assay compile cache", "fingerprint": compiler_fingerprint(device_type), "files": 0}
    files = [p for p in sorted(cache_dir.rglob("*")) if p.is_file() and not p.name.endswith((".lock", ".tmp"))]
    manifest["files"] = len(files)
    with atomic_path(archive) as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            data = json.dumps(manifest, indent=2).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for path in files:
                tar.add(path, arcname=f"cache/{path.relative_to(cache_dir)}", recursive=False)
    return manifest | {"archive": str(archive), "cache_dir": str(cache_dir)}


def read_manifest(archive: str | Path) -> dict:
    archive = Path(archive)
    if not archive.is_file():
        raise AssayError(f"{archive} does not exist")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            return json.loads(member.read())
    except (tarfile.TarError, KeyError, json.JSONDecodeError, OSError):
        raise AssayError(f"{archive} is not an assay compile-cache archive") from None


def import_cache(archive: str | Path, cache_dir: str | Path | None = None, device_type: str = "cpu") -> dict:
    manifest = read_manifest(archive)
    here = compiler_fingerprint(device_type)
    mismatched = {k: (manifest["fingerprint"].get(k), v) for k, v in here.items() if manifest["fingerprint"].get(k) != v}
    if mismatched:
        detail = ", ".join(f"{k} {theirs} (here {ours})" for k, (theirs, ours) in mismatched.items())
        raise AssayError(f"refusing a compile cache from another stack: {detail}")
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    from assay.core.checks import check_output_folder

    check_output_folder("--cache-dir", cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    extracted = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.name.startswith("cache/") or not member.isfile():
                continue
            relative = Path(member.name[len("cache/"):])
            if relative.is_absolute() or ".." in relative.parts:
                raise AssayError(f"{archive} holds an unsafe path {member.name!r}")
            target = cache_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            with atomic_path(target) as tmp:
                tmp.write_bytes(source.read())
            extracted += 1
    return {"cache_dir": str(cache_dir), "files": extracted, "fingerprint": here}


def mega_cache_file(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / MEGA_FOLDER / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".bin")


def load_mega_cache(cache_dir: str | Path, key: str) -> bool:
    """Pre-load torch's portable compile artifacts saved by an earlier probe of `key`, if any."""
    import torch

    path = mega_cache_file(cache_dir, key)
    if not path.is_file():
        return False
    return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None


def save_mega_cache(cache_dir: str | Path, key: str) -> bool:
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return False
    artifacts, _info = saved
    with atomic_path(mega_cache_file(cache_dir, key)) as tmp:
        tmp.write_bytes(artifacts)
    return True


def cache_dir_from_env() -> Path | None:
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(value) if value else None
