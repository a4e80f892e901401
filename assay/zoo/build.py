"""`assay zoo build DIR`: write every zoo entry as a Hugging Face checkpoint folder, offline.

Deterministic: the same assay and Transformers versions give the same weights (seeded per entry),
so a probe result on `zoo/qwen3` means the same thing on every machine.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch

from assay.core.errors import AssayError
from assay.core.files import atomic_folder, atomic_write_json, reporting_disk_full
from assay.zoo.entries import IMAGE_TEXT, ZOO, ZooEntry
from assay.zoo.identity import STAMP_FILE, fingerprint, zoo_identity
from assay.core.tokens import TOKEN_IDS

ZOO_FORMAT = 1
CATALOG_FILE = "catalog.json"


def entry_seed(name: str) -> int:
    return zlib.crc32(name.encode())


def build_entry(entry: ZooEntry, target: Path) -> Path:
    """Write one checkpoint folder: built in a staging folder beside it, then swapped in (core.files.atomic_folder)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

    from assay.zoo.tokenizer import write_tokenizer

    with atomic_folder(target) as staging:  # a reader sees the previous entry or the new one, never half of one
        torch.manual_seed(entry_seed(entry.name))
        if entry.builder is not None:
            entry.builder(entry, staging, entry_seed(entry.name))
        else:
            config = entry.make_config()
            auto = AutoModelForImageTextToText if entry.task == IMAGE_TEXT else AutoModelForCausalLM
            model = auto.from_config(config, dtype=torch.float32)
            if entry.pretrain_steps:
                from assay.zoo.pretrain import pretrain_on_corpus

                pretrain_on_corpus(model, steps=entry.pretrain_steps, seed=entry_seed(entry.name))
            model.generation_config = GenerationConfig(**TOKEN_IDS, do_sample=False)
            model.save_pretrained(staging)
        write_tokenizer(staging)
        if entry.task == IMAGE_TEXT:
            _write_processor(entry, staging)
        atomic_write_json(
            staging / STAMP_FILE,
            {"format": ZOO_FORMAT, "name": entry.name, "stands_in_for": entry.stands_in_for, "task": entry.task,
             "architecture": entry.architecture, "features": list(entry.features), "seed": entry_seed(entry.name),
             "files": fingerprint(staging)},
        )
    return target


def _write_processor(entry: ZooEntry, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if entry.name == "llava":
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = LlavaProcessor(
            image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
            vision_feature_select_strategy="default", num_additional_image_tokens=1, image_token="<image>",
        )
    elif entry.name == "gemma3-vision":
        from transformers import Gemma3ImageProcessorPil, Gemma3Processor

        tokenizer = AutoTokenizer.from_pretrained(
            folder, extra_special_tokens={"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
        )
        image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
        processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4)
    else:
        raise AssayError(f"zoo entry {entry.name!r} has no processor recipe")
    processor.save_pretrained(folder)


def is_built(folder: Path, entry: ZooEntry) -> bool:
    """Built and intact: a damaged entry (or one from a build without fingerprints) is built again."""
    record = zoo_identity(folder)
    return record is not None and record.get("format") == ZOO_FORMAT and record.get("name") == entry.name


def catalog_rows() -> list[dict]:
    return [
        {"name": e.name, "stands_in_for": e.stands_in_for, "task": e.task, "architecture": e.architecture, "features": list(e.features)}
        for e in ZOO.values()
    ]


def build_zoo(out: str | Path, names: list[str] | None = None, force: bool = False, progress: bool = True) -> list[Path]:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AssayError(f"{out} exists and is not a folder")
    unknown = sorted(set(names or []) - set(ZOO))
    if unknown:
        raise AssayError(f"unknown zoo entries {unknown} (known: {', '.join(ZOO)})")
    entries = [ZOO[name] for name in (names or ZOO)]
    from assay.core.progress import progress_bar

    built = []
    with progress_bar("building zoo", total=len(entries), enabled=progress) as advance:
        for entry in entries:
            folder = out / entry.name
            if force or not is_built(folder, entry):
                kept = f"{folder} is as it was" if folder.exists() else f"nothing written at {folder}"
                with reporting_disk_full(f"zoo entry {folder}", kept=kept):
                    build_entry(entry, folder)
            built.append(folder)
            advance(entry.name)
    atomic_write_json(out / CATALOG_FILE, {"format": ZOO_FORMAT, "entries": catalog_rows()})
    return built
