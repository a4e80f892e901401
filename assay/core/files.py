"""Atomic file writes: a temporary name in the same folder, fsync, then rename.

A crash or kill mid-write leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from assay.core.errors import AssayError

# A write that failed because the disk (or this process's file-size limit, or a quota) has no room.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_DISK_FULL_TEXT = tuple(os.strerror(code) for code in DISK_FULL_ERRNOS)


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
        fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)
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
        fsync_dir(target.parent)
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


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as written:
        os.fsync(written.fileno())


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and flush it to disk: a killed run keeps every finished line. A line that
    cannot be written whole (the disk is full) is cut back off, so the file never ends in half a line."""
    line = (json.dumps(record, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete leftovers of writes that were killed before their rename."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename inside `folder` durable (the directory entry itself is data)."""
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


def disk_full_error(error: BaseException | None) -> OSError | str | None:
    """The no-room error behind `error` (itself, a cause or context, or a failure DCP collected from a
    rank), or None. Libraries that wrap an OSError in their own type keep its text: that is matched too."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return current
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            pending.extend(failure[0] for failure in failures.values() if isinstance(failure, tuple) and failure)
        pending.extend([current.__cause__, current.__context__])
        if any(text in str(current) for text in _DISK_FULL_TEXT):
            return next(text for text in _DISK_FULL_TEXT if text in str(current))
    return None


@contextlib.contextmanager
def reporting_disk_full(what: str, kept: str = "") -> Iterator[None]:
    """Turn a write that ran out of room into one line (AssayError: exit 2 on the CLI) naming what was
    being written and what was kept; any other failure passes through unchanged."""
    try:
        yield
    except BaseException as error:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
        if isinstance(error, (KeyboardInterrupt, SystemExit, AssayError)):
            raise
        full = disk_full_error(error)
        if full is None:
            raise
        reason = os.strerror(full.errno) if isinstance(full, OSError) else full
        raise AssayError(f"cannot write {what}: {reason.lower()}" + (f"; {kept}" if kept else "")) from None
