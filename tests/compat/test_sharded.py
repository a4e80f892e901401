"""Sharded probes: processes the probe starts itself (gloo on CPU), a judge, the fewest devices."""

import json
import random
import subprocess
import sys

import pytest
import torch

from assay.compat.probe.judge import judge_text
from assay.compat.probe.execute import probe
from assay.compat.probe.request import ProbeRequest
from assay.core.numerics import tolerance
from assay.zoo.corpus import corpus_split

# The judged probe's eval scores the first 25 of the task's 100 items on 2 ranks and on the reference: each item's
# forward is a collective either way, and agreement item by item is what is checked, not accuracy.
EVAL_LIMIT = 25


@pytest.mark.distributed
def test_tensor_parallel_probe_on_two_processes_matches_the_single_device_run(zoo_dir, tmp_path):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="aot_eager", new_tokens=8, devices=2))
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["num_devices"] == 2 and row["parallelism"] == "tensor"
    assert row["generated_tokens"] == row["reference_tokens"]
    assert row["graphs"] >= 1
    # Without a judge too, the row carries the drift columns a one-device row has: per compared step,
    # within the float32 round-off of a sharded reduction (the judged test below also checks the eval's).
    assert row["check"] == "tokens-vs-cpu-eager"
    assert len(row["logit_max_rel"]) == 8 and row["logit_max_rel_max"] <= tolerance("model_logits", torch.float32)
    assert row["logit_cosine_min"] > 0.999999
    # Its run.py starts its own two processes too, and prints the same tokens.
    script = tmp_path / "run.py"
    script.write_text(row["run_py"])
    result = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["tokens"] == row["generated_tokens"]


@pytest.mark.distributed
def test_sweep_puts_a_model_on_the_fewest_devices_that_hold_it(zoo_dir, tmp_path, assay_cli):
    # The zoo's qwen3 holds about 1 MB of float32 weights: with 0.6 MB per device it needs two.
    args = [str(zoo_dir / "qwen3"), "--backend", "aot_eager", "--new-tokens", "6", "--device-memory-gb", "0.0006", "--out", str(tmp_path), "--json"]
    too_few = assay_cli("sweep", *args, "--max-devices", "1")
    assert too_few.returncode == 2 and "needs 2 devices" in too_few.stderr
    result = assay_cli("sweep", *args, "--max-devices", "4")
    assert result.returncode == 0, result.stderr[-2000:]
    [row] = json.loads(result.stdout)["rows"]
    assert row["num_devices"] == 2 and row["status"] == "PASS", (row["reason"], row["error"])


@pytest.mark.slow
def test_model_without_a_parallel_plan_cannot_be_sharded(zoo_dir, tmp_path, assay_cli):
    result = assay_cli("probe", str(zoo_dir / "gpt2"), "--devices", "2", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "neither a tensor- nor an expert-parallel plan" in result.stderr


@pytest.fixture(scope="module")
def judge(zoo_dir):
    return str(zoo_dir / "qwen3-pretrained")


def test_judge_tells_fluent_english_from_gibberish(judge):
    _, held_out = corpus_split()
    paragraphs = [p for p in held_out.split("\n\n") if len(p) > 400][:3]
    rng = random.Random(0)
    for paragraph in paragraphs:
        text = paragraph[:600]
        assert judge_text(text, judge).fluent, judge_text(text, judge).reason
        words = text.split()
        rng.shuffle(words)
        assert not judge_text(" ".join(words), judge).fluent  # English words, no English order
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge)
    noise = tokenizer.decode([rng.randrange(10, 1024) for _ in range(80)])
    assert not judge_text(noise, judge).fluent
    loop = "the value of the " * 20
    verdict = judge_text(loop, judge)
    assert not verdict.fluent and "repeat" in verdict.reason


@pytest.mark.distributed
def test_expert_parallel_moe_probe_matches_the_single_device_run(zoo_dir):
    # Every zoo MoE also has a TP plan, so expert parallelism is asked for by name here; "auto" picks it
    # for MoE models that have only an expert-parallel plan.
    row = probe(ProbeRequest(str(zoo_dir / "qwen3-moe"), backend="aot_eager", new_tokens=6, devices=2, parallelism="expert"))
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["parallelism"] == "expert" and row["generated_tokens"] == row["reference_tokens"]


@pytest.mark.distributed
def test_a_judged_sharded_probe_gets_the_eval_and_drift_columns_of_a_single_device_row(zoo_dir, judge):
    # Tensor parallel over 2 ranks: every rank scores the task (each forward is a collective), rank 0 records.
    row = probe(ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="aot_eager", new_tokens=6, devices=2, judge=judge,
                             eval_tasks=("assay_next_sentence",), eval_limit=EVAL_LIMIT))
    assert row["status"] == "PASS" and row["check"] == "tokens-vs-cpu-eager+judge", (row["reason"], row["error"])
    assert row["eval_status"] == "AGREE" and row["eval_tasks"] == ["assay_next_sentence"] and row["eval_items"] == [EVAL_LIMIT], row["eval_reason"]
    assert row["eval_accuracy"] == row["eval_reference_accuracy"] and row["eval_agreement"] == [1.0]
    assert row["eval_graphs"] >= 1 and row["eval_seconds"][0] > 0
    # The logit drift of rank 0's generation against the single-device reference: float32 round-off of a
    # sharded reduction, per compared step.
    assert len(row["logit_max_rel"]) == 6 and row["logit_max_rel_max"] <= tolerance("model_logits", torch.float32)
    assert row["logit_cosine_min"] > 0.999999
