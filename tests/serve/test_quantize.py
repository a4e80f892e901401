"""`assay serve --quantize int8`: every linear layer's weight in int8 with one scale per output row, its matmul
through PyTorch's weight-only int8 kernel with bfloat16 activations (serve/runner/quantize.py).

Tolerances. One int8 layer against float64: the weight is rounded to max|w| / 127 per row (an error uniform
in half a step: for Gaussian weights, whose largest entry of 64-2,000 is 2.5-4 standard deviations, about
4 / 127 / sqrt(12) = 0.9% of a weight's size), each input and each output to bfloat16 (2^-9 = 0.2% each):
1.5e-2 of the output's norm. A whole model compounds that through its layers: the zoo's wide initialisation inflates it
(measured 0.4-7.9% of the float32 logits for the models below), so a model is held to 0.1 of its float32
logits, and the real model to what matters, its next-token loss on held-out text (measured +0.3%).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from assay.core.errors import AssayError
from assay.core.numerics import rel_error, tolerance
from assay.serve.engine.config import EngineConfig
from assay.serve.engine.engine import Engine, run_to_completion
from assay.serve.launch import load_engine
from assay.serve.runner.gemm import CPP_MAX_WIDTH, cpp_template_available
from assay.serve.runner.quantize import DEQUANTIZED_ROWS, Int8WeightOnlyLinear, is_quantized, quantize_linears, quantize_slot_model
from assay.serve.runner.weights import matmul_weight_bytes
from assay.serve.settings import ServeRequest

PROMPT = [5, 17, 42, 99, 3, 64, 7, 250]
CONFIG = EngineConfig(max_seqs=2, buckets=(1, 2), eager=True, max_len=64)
LAYER_TOLERANCE = 1.5e-2  # int8 rows + bfloat16 inputs, see the module docstring
MODEL_TOLERANCE = 0.1  # the zoo's models, see the module docstring
# Inductor's int8 step against the eager int8 step: float32 steps differ by reassociation only (1e-4), int8 ones by
# where each kernel rounds to bfloat16 too (2^-9 = 2e-3 of a layer's output each time): measured 6.4e-3 on the
# tiny Llama; 2e-2 bounds a few layers' worth.
INDUCTOR_INT8_TOLERANCE = 2e-2


def _logits(engine, next_token: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits at the prompt's end, then one decode step's on next_token, through the engine's pool."""
    slot_model, buffers = engine.slot_model, engine.pool.buffers
    with torch.no_grad():
        first = slot_model.prefill(torch.tensor([PROMPT]), 0, buffers)
        step = slot_model.decode(torch.tensor([[next_token]]), torch.tensor([0]), torch.tensor([len(PROMPT)]), buffers)
    return first, step


def _greedy(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, max_tokens=max_tokens)
    tokens = run_to_completion(engine)
    return [tokens[f"r{index}"] for index in range(len(prompts))]


@pytest.mark.parametrize("bias", [False, True])
def test_an_int8_layer_is_within_its_rounding_of_a_float64_reference(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias)
    x = torch.randn(3, 5, 96)
    quantized = Int8WeightOnlyLinear(linear)
    assert quantized.weight_int8.dtype == torch.int8 and quantized.weight_int8.shape == (160, 96)
    assert quantized.weight_int8.abs().amax(dim=1).eq(127).all()  # each row's largest weight takes the whole range
    with torch.no_grad():
        out = quantized(x)
        exact = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
        # What the kernel computes, in float64: the dequantized weight times the bfloat16-rounded input.
        rounded = x.bfloat16().double() @ quantized.dequantized().double().T + (linear.bias.double() if bias else 0)
    assert out.shape == (3, 5, 160) and out.dtype == torch.float32
    assert 1e-3 < rel_error(out, exact) <= LAYER_TOLERANCE  # > 1e-3: the weights really are int8
    assert rel_error(out, rounded) <= 2**-8  # the same products, the result rounded to bfloat16 (2^-9 per element at most)


def test_a_prefill_multiplies_by_the_dequantized_weight_and_a_decode_by_the_int8_kernel():
    torch.manual_seed(1)
    quantized = Int8WeightOnlyLinear(nn.Linear(64, 48, bias=False))
    for rows, kernel in ((DEQUANTIZED_ROWS - 1, True), (DEQUANTIZED_ROWS, False)):
        x = torch.randn(rows, 64)
        with torch.no_grad():
            out = quantized(x)
        exact = x.double() @ quantized.dequantized().double().T  # the same int8 weight, nothing else rounded
        error = rel_error(out, exact)
        # The kernel rounds its input and output to bfloat16 (2^-9 each); the float32 GEMM only reassociates
        # float32 sums of K = 64 products (1e-6).
        assert (error > 1e-4) if kernel else (error < 1e-5), (rows, error)


@pytest.mark.parametrize("model", ["llama", "qwen3", "gla", "gemma3"])
def test_a_quantized_model_serves_logits_near_its_float32_ones(zoo_dir, model):
    full = load_engine(ServeRequest(model=str(zoo_dir / model)), CONFIG)
    linears = sum(isinstance(module, nn.Linear) for module in full.slot_model.model.modules())
    quantized = load_engine(ServeRequest(model=str(zoo_dir / model)), replace(CONFIG, quantize="int8"))
    modules = list(quantized.slot_model.model.modules())
    assert sum(isinstance(m, Int8WeightOnlyLinear) for m in modules) == linears > 0
    assert not any(isinstance(m, nn.Linear) for m in modules)
    # The lookup table stays float32 (a tied head gets an int8 copy), and the step reads about a quarter of the bytes.
    assert all(p.dtype == torch.float32 for p in quantized.slot_model.model.parameters())
    assert matmul_weight_bytes(quantized.slot_model.model) < 0.3 * matmul_weight_bytes(full.slot_model.model)
    for reference, served in zip(_logits(full), _logits(quantized)):
        assert served.dtype == torch.float32
        assert 0 < rel_error(served, reference) <= MODEL_TOLERANCE, (model, rel_error(served, reference))


def test_quantizing_an_int8_model_again_leaves_it_as_it_is(zoo_dir):
    engine = load_engine(ServeRequest(model=str(zoo_dir / "llama")), replace(CONFIG, quantize="int8"))
    before = _logits(engine)
    quantize_slot_model(engine.slot_model, "int8", torch.device("cpu"))  # already int8: left as it is
    assert is_quantized(engine.slot_model.model)
    for a, b in zip(before, _logits(engine)):
        assert torch.equal(a, b)
    with pytest.raises(AssayError, match="no linear layer"):
        quantize_linears(nn.Sequential(nn.ReLU()), "int8")


def test_the_compiled_int8_step_gives_the_eager_int8_logits(zoo_dir):
    # aot_eager: the graph dynamo captures around the int8 kernel, without inductor's compile time (the
    # inductor form is measured by bench/serve/decode_gemm.py --quantize int8).
    eager = load_engine(ServeRequest(model=str(zoo_dir / "qwen3")), replace(CONFIG, quantize="int8"))
    compiled = Engine(eager.slot_model, replace(CONFIG, quantize="int8", eager=False, backend="aot_eager", check_eager=True))
    compiled.warm_up()
    assert _greedy(compiled, [PROMPT, PROMPT[:5]], 6) == _greedy(eager, [PROMPT, PROMPT[:5]], 6)
    check = compiled.stats().eager_check
    assert check.steps > 0 and check.max_rel <= tolerance("compiled_vs_eager", torch.float32), check  # reassociation only


@pytest.mark.slow
def test_the_real_model_in_int8_keeps_its_loss_and_its_answers(real_model_dir):
    from transformers import AutoTokenizer

    from assay.zoo.corpus import corpus_split

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    ids = tokenizer(corpus_split()[1])["input_ids"]
    chunks = [ids[start : start + 128] for start in range(0, len(ids) - 127, 128)]  # held-out text, 9 x 128 tokens
    config = EngineConfig(max_seqs=1, buckets=(1,), eager=True, max_len=256)

    def loss(engine) -> float:
        total = 0.0
        with torch.no_grad():
            for chunk in chunks:
                tokens = torch.tensor([chunk])
                logits = engine.slot_model.prefill(tokens, 0, engine.pool.buffers, all_logits=True).reshape(len(chunk), -1)
                total += torch.nn.functional.cross_entropy(logits[:-1], tokens[0, 1:], reduction="sum").item()
        return total / sum(len(chunk) - 1 for chunk in chunks)

    full = load_engine(ServeRequest(model=str(real_model_dir)), config)
    quantized = load_engine(ServeRequest(model=str(real_model_dir)), replace(config, quantize="int8"))
    reference, served = loss(full), loss(quantized)
    # Measured: 3.155 -> 3.165 nats (+0.3%); bfloat16 weights +0.07%. 1% would be a broken layer or scale.
    assert 1e-4 < (served - reference) / reference <= 1e-2, (reference, served)
    prompt = tokenizer("The capital of France is")["input_ids"]
    [answer] = _greedy(quantized, [prompt], 3)
    assert tokenizer.decode(answer).startswith(" Paris")


@pytest.mark.inductor
@pytest.mark.skipif(not cpp_template_available("cpu", "inductor"), reason="the C++ GEMM template's micro-kernels are x86 code")
def test_inductor_serves_int8_through_the_template_when_narrow_and_the_library_when_wide(zoo_dir):
    # serve/runner/gemm.py: `auto` gives int8 weights the template up to width 4 (its weight-only int8 micro-kernel).
    wide = 2 * CPP_MAX_WIDTH["int8"]
    config = EngineConfig(max_seqs=wide, buckets=(1, wide), backend="inductor", quantize="int8", check_eager=True, max_len=64)
    engine = Engine.from_checkpoint(zoo_dir / "llama", config)
    engine.warm_up()
    assert engine.runner.decoder.gemms == {1: "cpp", wide: "aten"}
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [100, 200, 300]]
    alone = _greedy(engine, prompts[:1], 5)[0]  # width 1: the template's graph
    together = _greedy(engine, prompts, 5)  # width 8: three rows and five padding rows
    check = engine.stats().as_dict()["eager_check"]
    assert check["steps"] > 0
    assert check["max_rel"] <= INDUCTOR_INT8_TOLERANCE, check
    assert together[0] == alone


def test_the_w8a8_checkpoint_for_vllm_holds_the_int8_weights_assay_serves(zoo_dir, tmp_path):
    # bench/serve/w8a8_checkpoint.py makes vLLM's int8 peer: its weights must be assay's int8 weights, so the
    # peers' int8 table compares kernels, not roundings. The scales: float32 there, bfloat16 in assay (its
    # kernel's dtype), so equal within bfloat16's rounding (2 ** -8 relative).
    from safetensors.torch import load_file

    script = Path(__file__).resolve().parents[2] / "bench" / "serve" / "w8a8_checkpoint.py"
    completed = subprocess.run([sys.executable, str(script), str(zoo_dir / "llama"), str(tmp_path / "w8a8")], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    converted, source = load_file(tmp_path / "w8a8" / "model.safetensors"), load_file(zoo_dir / "llama" / "model.safetensors")
    config = json.loads((tmp_path / "w8a8" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    name = "model.layers.0.mlp.down_proj.weight"
    layer = Int8WeightOnlyLinear(_linear_with(source[name]))
    assert converted[name].dtype == torch.int8 and torch.equal(converted[name], layer.weight_int8)
    assert rel_error(converted[name.removesuffix("weight") + "weight_scale"][:, 0], layer.scale.float()) <= 2**-8
    linears = [key for key in converted if key.endswith("weight_scale")]
    assert len(linears) == 7 * sum(key.endswith("input_layernorm.weight") for key in source)
    assert torch.equal(converted["model.embed_tokens.weight"], source["model.embed_tokens.weight"])
    assert (tmp_path / "w8a8" / "tokenizer.json").is_file()
    refused = subprocess.run([sys.executable, str(script), str(zoo_dir / "qwen3"), str(tmp_path / "q")], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and refused.stderr.strip().startswith("error:") and "Traceback" not in refused.stderr
    assert not (tmp_path / "q").exists()


def _linear_with(weight: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    return linear
