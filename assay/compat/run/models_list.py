"""Which models a sweep probes: positional ids or paths, a zoo folder, a list file; and its shard."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from assay.core.errors import AssayError


def models_from_zoo(folder: str | Path) -> list[str]:
    from assay.zoo import CATALOG_FILE

    catalog = Path(folder) / CATALOG_FILE
    if not Path(folder).is_dir():
        raise AssayError(f"--zoo {folder} is not a folder (it does not exist or is a file)")
    if not catalog.is_file():
        raise AssayError(f"{folder} is not a zoo folder (no {CATALOG_FILE}; build one with `assay zoo build {folder}`)")
    entries = json.loads(catalog.read_text())["entries"]
    return [str(Path(folder) / entry["name"]) for entry in entries]


def models_from_list(path: str | Path) -> list[str]:
    from assay.core.checks import check_input_file

    path = Path(path)
    check_input_file("--list", path)
    models = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            models.append(line)
    return models


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`3/8` -> (3, 8): this machine takes the third of eight shares (1-based)."""
    if not text:
        return None
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise AssayError(f"--shard wants i/n such as 3/8, got {text!r}") from None
    if not 1 <= index <= count:
        raise AssayError(f"--shard {text}: i must be between 1 and n")
    return index, count


def shard_models(models: list[str], shard: tuple[int, int] | None) -> list[str]:
    """Deterministic split by a hash of the model name: a model's shard does not depend on the list's
    order or on the other models in it, so machines given differently ordered lists still agree."""
    if shard is None:
        return models
    index, count = shard
    return [m for m in models if zlib.crc32(m.encode()) % count == index - 1]


def collect_models(positional: list[str], zoo: str | None, list_file: str | None) -> list[str]:
    models = list(positional)
    if zoo:
        models += models_from_zoo(zoo)
    if list_file:
        models += models_from_list(list_file)
    unique = list(dict.fromkeys(models))  # keep order, drop repeats
    if not unique:
        raise AssayError("no models to sweep: give ids or paths, --zoo DIR or --list FILE")
    return unique
