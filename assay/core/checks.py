"""Input checks shared by every command, run where the input enters and before any work or any write.

The rule they implement is docs/errors.md: bad input (a path that is not a checkpoint, a checkpoint
without the tokenizer a command needs, an output that cannot be written) is an AssayError, which the
CLI prints as one line and exit 2. A checkpoint that is a checkpoint but is damaged (config.json that
is not JSON, unreadable weights) is reported as `damage`: the probe records it as a FAIL_LOAD row (a
broken model is a result); commands that cannot record a row raise it with `check_checkpoint`.

Only the standard library here: these run before torch or Transformers is imported.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from assay.core.errors import AssayError

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# Any one of these lets AutoTokenizer build a tokenizer (fast JSON, sentencepiece, BPE vocab, WordPiece vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# A safetensors header is a little-endian u64 length, then that many bytes of JSON. Real headers are
# kilobytes to a few megabytes; a length past this is random bytes, not a header.
MAX_SAFETENSORS_HEADER = 100 * 2**20


@dataclass
class CheckpointState:
    """What a checkpoint folder holds: its parsed config and, when the files are broken, why."""

    folder: Path
    config: dict = field(default_factory=dict)
    damage: str | None = None  # None: the files look whole; else one line saying what is broken


def inspect_checkpoint(path: str | os.PathLike, *, weights: bool = True, tokenizer: bool = True) -> CheckpointState:
    """Bad input raises AssayError: no such folder, no config.json, no tokenizer (when `tokenizer`).
    Damage is returned, not raised: config.json that is not a JSON object, missing or unreadable
    weights (checked only when `weights`: a random-init run needs none)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise AssayError(f"no checkpoint at {path}: not a file or folder")
    if not folder.is_dir() or not (folder / CONFIG_FILE).is_file():
        raise AssayError(f"{path} is not a checkpoint (expected a folder with {CONFIG_FILE})")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise AssayError(f"the checkpoint at {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    state = CheckpointState(folder)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        state.damage = f"{folder / CONFIG_FILE} is not valid JSON ({error})"
        return state
    if not isinstance(config, dict):
        state.damage = f"{folder / CONFIG_FILE} is not a JSON object"
        return state
    state.config = config
    if weights:
        state.damage = _weights_damage(folder)
    return state


def check_checkpoint(path: str | os.PathLike, *, weights: bool = True, tokenizer: bool = True) -> CheckpointState:
    """inspect_checkpoint for commands that have no row to record a broken model in: damage is bad input too."""
    state = inspect_checkpoint(path, weights=weights, tokenizer=tokenizer)
    if state.damage:
        raise AssayError(f"the checkpoint at {path} is broken: {state.damage}")
    return state


def _weights_damage(folder: Path) -> str | None:
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        return f"no weights ({' or '.join(WEIGHT_FILES[:2])})"
    if present[0] == "model.safetensors":
        return safetensors_header_damage(folder / "model.safetensors")
    if present[0] == "model.safetensors.index.json":
        try:
            shards = sorted(set(json.loads((folder / present[0]).read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            return f"{present[0]} is not a safetensors index (a JSON object with weight_map)"
        for shard in shards:
            if not (folder / shard).is_file():
                return f"{present[0]} names {shard}, which is missing"
            damage = safetensors_header_damage(folder / shard)
            if damage:
                return damage
    return None


def safetensors_header_damage(path: Path) -> str | None:
    """Read only the header (8 bytes and its JSON): random bytes or a truncated file are found at once,
    without loading a tensor."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{path.name} is too short to be safetensors ({size} bytes)"
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_SAFETENSORS_HEADER, size - 8):
            return f"{path.name} is not safetensors (its header length {length} does not fit a {size}-byte file)"
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return f"{path.name} is not safetensors (its header is not JSON)"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    if ends and 8 + length + max(ends) > size:
        return f"{path.name} is truncated ({size} bytes; its header describes {8 + length + max(ends)})"
    return None


# ---------------------------------------------------------------- output targets


def check_output_file(flag: str, path: str | os.PathLike | None) -> None:
    """A file the command will write: not a folder, and its parent (when it exists) is a folder.

    Checked before the job starts, so a bad target fails in a second, not after the work."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise AssayError(f"{flag} {path} is a folder; name a file to write")
    _check_creatable(flag, path, target.parent)


def check_output_folder(flag: str, path: str | os.PathLike | None) -> None:
    """A folder the command will create or write into: not an existing file, and creatable."""
    if path is None:
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise AssayError(f"{flag} {path} is a file, not a folder")
    _check_creatable(flag, path, target)


def _check_creatable(flag: str, path, folder: Path) -> None:
    """`folder` exists as a writable folder, or its nearest existing ancestor is one (mkdir will work)."""
    parent = _existing_ancestor(folder)
    if not parent.is_dir():
        raise AssayError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise AssayError(f"{flag} {path}: {parent} is not writable")


def check_input_file(flag: str, path: str | os.PathLike | None) -> None:
    """A file the command reads: it exists and is a file (a folder gets its own message)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise AssayError(f"{flag} {path} is a folder, not a file")
    if not target.is_file():
        raise AssayError(f"{flag} {path} does not exist")


def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
