import hashlib
import json

import pytest

from assay.zoo import CATALOG_FILE, ZOO
from assay.zoo.build import build_entry


def test_catalog_covers_required_architectures_and_tasks(zoo_dir):
    catalog = json.loads((zoo_dir / CATALOG_FILE).read_text())["entries"]
    tasks = [e["task"] for e in catalog]
    assert tasks.count("text-generation") >= 12
    assert tasks.count("image-text-to-text") >= 2
    features = {f for e in catalog for f in e["features"]}
    assert {"tied", "untied", "gqa", "qk_norm", "moe", "sliding_window", "vision"} <= features
    assert all("/" in e["stands_in_for"] for e in catalog)  # a public Hub id each


@pytest.mark.parametrize("name", sorted(name for name, entry in ZOO.items() if entry.transformers_native))
def test_every_entry_is_a_checkpoint_transformers_loads(zoo_dir, name):
    from transformers import AutoConfig, AutoTokenizer

    folder = zoo_dir / name
    for required in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (folder / required).is_file(), required
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == [ZOO[name].architecture]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "Built-in functions: len(), print() and zip()."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level BPE round-trips any text


def test_build_is_deterministic(zoo_dir, tmp_path):
    rebuilt = build_entry(ZOO["qwen3"], tmp_path / "qwen3")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(rebuilt / "model.safetensors") == digest(zoo_dir / "qwen3" / "model.safetensors")
    assert digest(rebuilt / "tokenizer.json") == digest(zoo_dir / "qwen3" / "tokenizer.json")


def test_pretrained_entry_is_far_below_random_loss(zoo_dir):
    import math

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from assay.zoo.corpus import corpus_text

    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "qwen3-pretrained")
    ids = torch.tensor([tokenizer(corpus_text()[:20000])["input_ids"][:512]])
    losses = {}
    for name in ("qwen3", "qwen3-pretrained"):
        model = AutoModelForCausalLM.from_pretrained(zoo_dir / name).eval()
        with torch.no_grad():
            losses[name] = model(input_ids=ids, labels=ids).loss.item()
    # ln(1024) = 6.93 is the uniform guess; a random model sits at or above it, a trained one far below.
    assert losses["qwen3"] > 0.9 * math.log(1024)
    assert losses["qwen3-pretrained"] < 0.75 * math.log(1024)


def test_build_refuses_unknown_entry(assay_cli, tmp_path):
    result = assay_cli("zoo", "build", str(tmp_path / "z"), "--only", "qwen3,nope")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: unknown zoo entries ['nope'] (known: " + ", ".join(ZOO) + ")"]
