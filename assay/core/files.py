"""Atomic file writes: a temporary name in the same folder, fsync, then rename.

A crash or kill mid-write leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is renamed over `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new folder beside `path`; on success it is renamed to `path`, replacing a previous one.

    Readers see the old folder or the new one, never a half-written one; on an error the staging
    folder is removed and `path` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Not ".tmp": remove_stale_temporaries unlinks those as files.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))
    try:
        yield staging
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".retired", dir=target.parent))
            os.replace(target, retired)  # rename(2) over an empty folder
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as handle:
            yield handle


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and flush it to disk: a killed run keeps every finished line."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete leftovers of writes that were killed before their rename."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def user_cache_dir(name: str) -> Path:
    """$XDG_CACHE_HOME/assay/NAME (default ~/.cache/assay/NAME): what assay keeps between runs for this
    user (the probe's reference cache, converted real models). Read at each call: tests move it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "assay" / name
