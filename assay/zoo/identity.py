"""Which zoo entry a folder is: its stamp (assay_zoo.json) names the entry and fingerprints every file.

A copy of a zoo folder carries the stamp with it. The name is earned only while the files still match
the fingerprints the build recorded: a damaged or edited copy is then just a checkpoint at its path,
and probing it into a shared results folder cannot replace the real entry's row.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

STAMP_FILE = "assay_zoo.json"
# Zoo files are kilobytes to a few megabytes and are hashed whole; a larger file (a real-size model)
# is fingerprinted by its size and its first and last blocks, which a truncation or a rewrite changes.
WHOLE_FILE_LIMIT = 64 * 2**20
BLOCK = 4 * 2**20


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if size <= WHOLE_FILE_LIMIT:
            for chunk in iter(lambda: handle.read(BLOCK), b""):
                digest.update(chunk)
        else:
            digest.update(str(size).encode())
            digest.update(handle.read(BLOCK))
            handle.seek(size - BLOCK)
            digest.update(handle.read(BLOCK))
    return digest.hexdigest()


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file of the checkpoint but the stamp itself (and hidden leftovers), by name."""
    return {p.name: file_digest(p) for p in sorted(Path(folder).iterdir())
            if p.is_file() and p.name != STAMP_FILE and not p.name.startswith(".")}


def zoo_identity(folder: str | Path) -> dict | None:
    """The stamp's record when the folder is an intact zoo entry, else None (no stamp, an unreadable
    one, one from a build that recorded no fingerprints, or files that differ from them)."""
    stamp = Path(folder) / STAMP_FILE
    if not stamp.is_file():
        return None
    try:
        record = json.loads(stamp.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict) or "name" not in record:
        return None
    return record if fingerprint(Path(folder)) == record["files"] else None
