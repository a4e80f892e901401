"""The probe's task when a checkpoint's config.json has no `architectures` (a converted GGUF model, a
hand-written config): what AutoModelForCausalLM builds from `model_type`, as from_pretrained does."""

import json
import shutil

import pytest

from assay.compat.probe.execute import probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.probe.resolve import is_causal_lm_type


@pytest.mark.parametrize("model_type, causal", [("llama", True), ("qwen3_moe", True), ("gla", True), ("bert", True), ("vit", False), ("t5", False), ("no-such-type", False), (None, False)])
def test_causal_lm_types_come_from_the_auto_class_mapping(model_type, causal):
    # gla: assay's own registration counts (assay.models.auto); bert: BertLMHeadModel is in the mapping;
    # vit and t5: Transformers knows them, not as causal LMs.
    assert is_causal_lm_type(model_type) is causal


@pytest.mark.parametrize("entry, backend", [("llama", "eager"), ("qwen3", "aot_eager")])
def test_checkpoint_without_architectures_probes_pass(zoo_dir, tmp_path, entry, backend):
    folder = shutil.copytree(zoo_dir / entry, tmp_path / entry)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    row = probe(ProbeRequest(str(folder), backend=backend, new_tokens=6))
    assert row["task"] == "text-generation", row["reason"]
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["architecture"] == config["model_type"]
    assert row["generated_tokens"] == row["reference_tokens"] and len(row["generated_tokens"]) == 6


def test_checkpoint_of_a_model_type_that_is_no_causal_lm_is_skipped(zoo_dir, tmp_path):
    folder = shutil.copytree(zoo_dir / "llama", tmp_path / "vit-config")
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))
    row = probe(ProbeRequest(str(folder), backend="eager", new_tokens=2))
    assert row["status"] == "SKIPPED" and row["task"] == "unsupported (vit)"
