"""Every registered architecture walks the same steps on a tiny checkpoint of its own: one training step,
one served decode, one needle query, export and reload. An entry that forgets a piece fails here.

Tolerances: decode vs forward logits and reloaded logits with ("model_logits", float32): relative error
<= 1e-5 against the same float32 model (only summation order differs); the served decode of a fixed-state
model with ("recurrence", float32) <= 1e-4 (the chunked and the step form of the recurrence differ in order).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import math
import re
from pathlib import Path

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models import registry
from assay.zoo.native import TOKEN_IDS

ARCHS = registry.names()


def test_the_registry_holds_every_native_architecture():
    assert {"qwen3", "gla", "llama", "gemma3"} <= set(ARCHS)
    assert registry.for_config({"model_type": "qwen3_moe"}).name == "qwen3"
    assert registry.for_config({"model_type": "mistral"}).name == "llama"
    assert registry.find("gpt2") is None
    with pytest.raises(AssayError, match="no native model for model_type 'gpt2'"):
        registry.for_config({"model_type": "gpt2"})


def test_a_second_entry_for_a_taken_model_type_is_refused():
    spec = registry.get("llama")
    from dataclasses import replace

    with pytest.raises(AssayError, match="already owned by the llama entry"):
        registry.register(replace(spec, name="llama-copy"))
    assert "llama-copy" not in registry.names()


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    """(spec, checkpoint folder) of the entry's "tiny" flavour, random weights, the zoo tokenizer."""
    from assay.zoo.tokenizer import write_tokenizer

    spec = registry.get(request.param)
    args = spec.flavours["tiny"]
    folder = tmp_path_factory.mktemp(f"tiny-{spec.name}")
    write_tokenizer(folder)
    spec.export_hf(spec.build(args, "cpu", torch.float32, seed=0), args, folder, None, extra_config=TOKEN_IDS)
    return spec, folder


def test_kernel_targets_name_modules_of_the_kernels_class(tiny):
    from assay.kernels.registry import get_kernel

    spec, _ = tiny
    assert spec.kernel_targets, f"{spec.name} names no kernel replacement target"
    for kernel_name, pattern in spec.kernel_targets.items():
        target = get_kernel(kernel_name).target
        # A target may apply only to some sizes (grouped experts: MoE flavours): one flavour must have it.
        found = [
            name for args in spec.flavours.values() if args.vocab_size <= 1024
            for name, module in spec.build(args).named_modules() if fnmatch.fnmatchcase(name, pattern)
        ]
        assert found, f"{spec.name}: {kernel_name} pattern {pattern!r} matches no module of a tiny flavour"
        for args in (a for a in spec.flavours.values() if a.vocab_size <= 1024):
            for name, module in spec.build(args).named_modules():
                if fnmatch.fnmatchcase(name, pattern):
                    assert isinstance(module, target), (name, type(module).__name__)


def test_one_training_step(tiny):
    from assay.train import TrainRequest, train

    spec, folder = tiny
    result = train(TrainRequest(model=str(folder), path="native", steps=1, batch=2, seq_len=32))
    assert result.model.family is spec
    assert math.isfinite(result.losses[0]) and abs(result.losses[0] - math.log(1024)) < 0.5  # random init: near uniform
    assert result.summary["flops_per_token"] == pytest.approx(spec.flops_per_token(result.model.args, 32))


def test_one_served_decode(tiny):
    spec, folder = tiny
    adapter = spec.load_slot_model(folder, torch.device("cpu"), 32)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    buffers = adapter.pool_buffers(3, torch.float32, 32)
    with torch.no_grad():
        prefill_logits = adapter.prefill(prompt[:, :-1], 1, buffers)
        decoded = adapter.decode(prompt[:, -1:], torch.tensor([1]), torch.tensor([prompt.shape[1] - 1]), buffers)
        full = adapter.model(prompt)[0]
    check = "model_logits" if spec.cache.grows else "recurrence"
    assert_close(check, prefill_logits.double(), full[-2].double(), torch.float32)
    assert_close(check, decoded[0].double(), full[-1].double(), torch.float32)
    # Its bytes per sequence: a KV cache grows with the length, a fixed state does not.
    short, long = spec.state_bytes_per_sequence(adapter.args, 16), spec.state_bytes_per_sequence(adapter.args, 1024)
    assert (long > short) == spec.cache.grows and short > 0


def test_one_needle_query(tiny):
    from assay.recall.needle import NeedleRequest, run_needle

    spec, folder = tiny
    result = run_needle(NeedleRequest(model=str(folder), lengths=(64,), depths=(0.5,), trials=1, format="text"))
    assert result.kind == spec.name
    [cell] = result.cells
    assert cell["status"] == "ok" and cell["correct"] in (0, 1) and len(cell["examples"]) == 1


def test_export_and_reload(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    spec, folder = tiny
    model, args = spec.load(folder, None, False, "cpu", torch.float32)
    spec.export_hf(model.state_dict(), args, tmp_path, folder)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] in spec.model_types
    reloaded, reloaded_args = spec.load(tmp_path, None, False, "cpu", torch.float32)
    assert reloaded_args == args
    tokens = torch.randint(3, 1024, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens).double()
        assert_close("model_logits", reloaded(tokens).double(), expected, torch.float32)
        # Transformers reloads it too (GLA through assay's registration with its Auto classes).
        hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
        assert_close("model_logits", hf(input_ids=tokens).logits.double(), expected, torch.float32)


# ---------------------------------------------------------------- the layering the registry stands for

ASSAY = Path(__file__).resolve().parents[2] / "assay"
ARCH_LITERAL = r"[\"'](gla|qwen3|qwen3_moe|llama|mistral|gemma3|gemma3_text)[\"']"


def test_no_architecture_conditionals_outside_assay_models():
    pattern = re.compile(rf"(==|!=)\s*{ARCH_LITERAL}|{ARCH_LITERAL}\s*(==|!=)")
    offenders = [
        f"{path.relative_to(ASSAY.parent)}:{number}: {line.strip()}"
        for path in ASSAY.rglob("*.py") if "models" not in path.relative_to(ASSAY).parts[:1]
        for number, line in enumerate(path.read_text().splitlines(), start=1) if pattern.search(line)
    ]
    assert not offenders, "ask the registry (assay.models.registry), not the name:\n" + "\n".join(offenders)


def test_kernels_depend_on_the_shared_layers_not_on_a_model():
    imported = {
        f"{path.name}: {node.module}"
        for path in (ASSAY / "kernels").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("assay.models")
        and not node.module.startswith("assay.models.common.")
    }
    assert not imported, imported
