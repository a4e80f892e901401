"""What `assay serve` holds the model in: --dtype for the weights, --max-len against the model's positions.

bfloat16 weights round every matmul's inputs to 8 bits of mantissa, so the served logits stay within the
model_logits bfloat16 tolerance of the float32 ones (core/numerics), not equal to them; the logits the
slot_model hands the sampler are float32 either way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import torch

from assay.core.numerics import rel_error, tolerance
from assay.serve.engine.config import EngineConfig
from assay.serve.launch import load_engine
from assay.serve.settings import ServeRequest

PROMPT = [5, 17, 42, 99, 3, 64, 7, 250]


def _logits(engine, next_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's slot_model over its own pool: prefill logits at the prompt's end, then those of one decode
    step on next_token (the same token for both dtypes, so the step compares like with like)."""
    slot_model, buffers = engine.slot_model, engine.pool.buffers
    with torch.no_grad():
        first = slot_model.prefill(torch.tensor([PROMPT]), 0, buffers)
        step = slot_model.decode(torch.tensor([[next_token]]), torch.tensor([0]), torch.tensor([len(PROMPT)]), buffers)
    return first, step


CONFIG = EngineConfig(max_seqs=1, buckets=(1,), eager=True, max_len=64)


def _bf16_engine(folder):
    engine = load_engine(ServeRequest(model=str(folder), dtype="bf16"), CONFIG)
    weights = {param.dtype for param in engine.slot_model.model.parameters()}
    assert weights == {torch.bfloat16}, weights
    return engine


@pytest.mark.parametrize("model", ["gla", "qwen3"])
def test_bfloat16_weights_serve_logits_within_bf16_tolerance_of_float32(zoo_dir, model):
    full = load_engine(ServeRequest(model=str(zoo_dir / model)), CONFIG)
    assert {param.dtype for param in full.slot_model.model.parameters()} == {torch.float32}
    tol = tolerance("model_logits", torch.bfloat16)
    for reference, served in zip(_logits(full, 11), _logits(_bf16_engine(zoo_dir / model), 11)):
        assert served.dtype == torch.float32
        error = rel_error(served, reference)
        assert 0 < error <= tol, (model, error, tol)  # > 0: the bfloat16 weights were really used


def test_bfloat16_llama_is_no_worse_than_transformers_own_bfloat16_model(zoo_dir):
    # The zoo's wide initialisation inflates activations: Transformers' own bfloat16 Llama lands at about
    # 3.8e-2 from float64 here, past the stated 3e-2. The served model rounds in the same order, so it is held
    # to Transformers' error (x1.5, as tests/models holds the native models), prefill and decode alike.
    from transformers import AutoModelForCausalLM

    folder = zoo_dir / "llama"
    served = _logits(_bf16_engine(folder), 11)
    with torch.no_grad():
        tokens = torch.tensor([PROMPT + [11]])
        exact = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()(tokens).logits[0]
        rounded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()(tokens).logits[0]
    for position, logits in zip((len(PROMPT) - 1, len(PROMPT)), served):
        assert logits.dtype == torch.float32
        bar = rel_error(rounded[position], exact[position])
        assert 0 < rel_error(logits, exact[position]) <= 1.5 * bar, (position, rel_error(logits, exact[position]), bar)


def _serve(folder, *flags: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(folder), "--port", "0", "--eager", "--max-seqs", "1", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    line = process.stdout.readline()
    if "http://" not in line:
        process.kill()
        raise AssertionError(f"no URL from assay serve: {line!r} {process.stderr.read()}")
    return process, line


@pytest.fixture(scope="module")
def scaled_llama(zoo_dir, tmp_path_factory):
    """The zoo's Llama (2,048 positions) with llama3 rope scaling: factor 2 over 2,048 original positions."""
    folder = tmp_path_factory.mktemp("scaled") / "llama-scaled"
    shutil.copytree(zoo_dir / "llama", folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 2048,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_max_len_past_the_positions_is_refused_in_one_line(zoo_dir, scaled_llama, assay_cli):
    plain = assay_cli("serve", "--model", str(zoo_dir / "llama"), "--max-len", "3000", "--port", "0", timeout=120)
    assert plain.returncode == 2, plain.stderr
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-len 3000 is past the model's 2048 positions" in lines[0], plain.stderr
    assert "no rope scaling" in lines[0] and "--max-len 2048 or less" in lines[0]
    beyond = assay_cli("serve", "--model", str(scaled_llama), "--max-len", "5000", "--port", "0", timeout=120)
    assert beyond.returncode == 2, beyond.stderr
    lines = beyond.stderr.strip().splitlines()
    assert len(lines) == 1 and "its rope scaling covers 4096" in lines[0], beyond.stderr


@pytest.mark.parametrize(
    "command, model, flags, message",
    [
        ("serve", "gla", ["--port", "0", "--dtype", "int8"], "--dtype 'int8': expected float32 or bfloat16"),
        ("serve-bench", "gla", ["--dtype", "fp8"], "--dtype 'fp8': expected float32 or bfloat16"),
        # serve-bench's slots hold the longest prompt + --max-tokens: the same refusal as --max-len
        ("serve-bench", "llama", ["--prompt-tokens", "2040", "--max-tokens", "32"], "--prompt-tokens + --max-tokens 2072 is past the model's 2048 positions"),
        ("serve", "qwen3", ["--port", "0", "--max-prefill-tokens", "0"], "--max-prefill-tokens must be at least 1, got 0"),
    ],
)
def test_an_unknown_dtype_or_a_slot_past_the_positions_exits_2_in_one_line(zoo_dir, assay_cli, command, model, flags, message):
    completed = assay_cli(command, "--model", str(zoo_dir / model), *flags, timeout=120)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], completed.stderr


@pytest.mark.slow
def test_max_len_the_rope_scaling_covers_is_served_in_bfloat16(scaled_llama):
    # 3,000 positions: past max_position_embeddings (2,048), within factor 2 x 2,048; bfloat16 weights.
    process, line = _serve(scaled_llama, "--max-len", "3000", "--dtype", "bfloat16")
    try:
        assert "bfloat16" in line and "3000 positions" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        response = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0}, timeout=60)
        assert response.status_code == 200, response.text
        assert 1 <= response.json()["usage"]["completion_tokens"] <= 4
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_engine_from_checkpoint_takes_the_weights_dtype_and_refuses_a_slot_past_the_positions(zoo_dir):
    # The Python API holds the same rules as the CLI: EngineConfig.dtype casts the weights, and a max_len
    # past max_position_embeddings (2,048, no rope scaling) is refused before anything loads.
    from assay.core.errors import AssayError
    from assay.serve.engine.engine import Engine

    engine = Engine.from_checkpoint(zoo_dir / "qwen3", EngineConfig(max_seqs=1, buckets=(1,), eager=True, max_len=64, dtype="bfloat16"))
    assert {param.dtype for param in engine.slot_model.model.parameters()} == {torch.bfloat16}
    with pytest.raises(AssayError, match="--max-len 3000 is past the model's 2048 positions"):
        Engine.from_checkpoint(zoo_dir / "llama", EngineConfig(max_seqs=1, buckets=(1,), eager=True, max_len=3000))
