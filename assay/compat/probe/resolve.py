"""What a MODEL argument names: a checkpoint folder (zoo or not) or a Hub id, and its task.

The first step of every probe (plan.py): bad input (no such folder, no tokenizer) is found here,
before any model work; a checkpoint whose files are damaged is kept as `damage` (a FAIL_LOAD row).
"""

from __future__ import annotations

from pathlib import Path

from assay.compat.probe.request import ModelRef
from assay.core.errors import AssayError


def resolve_model(model: str) -> ModelRef:
    """A local folder must be a checkpoint with a tokenizer (else bad input, docs/errors.md); anything else
    that looks like `org/name` is a Hub id. A checkpoint whose config.json is not JSON is broken, not bad
    input: it keeps its `damage` and is recorded as FAIL_LOAD."""
    from assay.core.checks import inspect_checkpoint
    from assay.zoo.identity import zoo_identity

    path = Path(model).expanduser()
    if path.exists():
        state = inspect_checkpoint(path, weights=False)  # the weights are the load's to judge (FAIL_LOAD)
        zoo = zoo_identity(path)  # the zoo name only for intact zoo files: a damaged copy is its path
        if zoo is not None:
            return ModelRef(str(path.resolve()), f"assay-zoo/{zoo['name']}", state.config, zoo.get("stands_in_for"), zoo.get("task"), state.damage)
        return ModelRef(str(path.resolve()), str(path.resolve()), state.config, damage=state.damage)
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or model.endswith(("/", ".json", ".safetensors"))
    if looks_local or not model.strip():
        raise AssayError(f"{model} is not a checkpoint (no such folder) and not a Hub model id")
    return ModelRef(model, model)


def infer_task(ref: ModelRef, override: str | None) -> str:
    if override:
        return override
    if ref.zoo_task:
        return ref.zoo_task
    architectures = ref.config.get("architectures") or []
    if "vision_config" in ref.config or any("ConditionalGeneration" in a for a in architectures):
        return "image-text-to-text"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "text-generation"
    if not ref.config:  # a Hub id: from_pretrained decides; the common case is a causal LM
        return "text-generation"
    if not architectures and is_causal_lm_type(ref.config.get("model_type")):
        return "text-generation"
    return f"unsupported ({', '.join(architectures) or ref.config.get('model_type', 'unknown')})"


def is_causal_lm_type(model_type: str | None) -> bool:
    """Whether AutoModelForCausalLM builds a model for this config model_type: what from_pretrained does
    for a config without `architectures` (a converted GGUF checkpoint, a hand-written config). Asks the
    Auto class's own mapping, so every architecture Transformers (or an assay registration) adds counts."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    try:
        config_class = CONFIG_MAPPING[model_type] if model_type else None
    except KeyError:
        return False
    return config_class is not None and config_class in AutoModelForCausalLM._model_mapping
