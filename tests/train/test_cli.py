"""`assay train` and `assay plot` as a user runs them: metrics JSONL, summary, PNG, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest

from assay.core.metrics import read_jsonl


@pytest.mark.slow
def test_train_writes_metrics_and_plot_draws_them(train_zoo, tmp_path, assay_cli):
    metrics = tmp_path / "run.jsonl"
    completed = assay_cli("train", "--model", str(train_zoo / "qwen3"), "--path", "native", "--steps", "4", "--seq-len", "32",
                          "--metrics", str(metrics), "--peak-flops", "measure")
    assert completed.returncode == 0, completed.stderr
    assert "warm-up" in completed.stdout and "steady" in completed.stdout  # the phases reported apart
    records = read_jsonl(metrics)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["warmup"] for r in records] == [True, False, False, False]
    assert all(r["mfu"] > 0 for r in records)  # against the measured CPU matmul peak

    png = tmp_path / "run.png"
    plotted = assay_cli("plot", str(metrics), "-o", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.slow
def test_json_summary_keeps_warmup_apart_from_steady_state(train_zoo, assay_cli):
    completed = assay_cli("train", "--model", str(train_zoo / "qwen3"), "--path", "hf", "--steps", "3", "--seq-len", "32", "--json")
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    summary = result["summary"]
    assert summary["path"] == "hf" and summary["warmup_steps"] == 1 and summary["steady_steps"] == 2
    assert summary["warmup_tokens_per_s"] > 0 and summary["steady_tokens_per_s"] > 0
    assert len(result["records"]) == 3


@pytest.mark.slow
def test_check_init_exit_codes(train_zoo, assay_cli):
    good = assay_cli("train", "--model", str(train_zoo / "qwen3-pretrained"), "--check-init", "--steps", "0")
    assert good.returncode == 0, good.stderr
    assert "weights loaded" in good.stdout
    bad = assay_cli("train", "--model", str(train_zoo / "qwen3"), "--check-init", "--steps", "0")
    assert bad.returncode == 1  # the check ran and found a failure
    assert "NOT loaded" in bad.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--path", "jax"], "unknown --path 'jax'"),
        (["--spec", "layres=4"], "spec override 'layres' is not a Qwen3 field"),
        (["--tp", "3"], "tensor parallel degree 3 does not divide"),
        (["--dp-shard", "2"], "needs 2 processes, 1 launched"),
        (["--kernels", "nope"], "unknown kernel 'nope'"),
        (["--path", "hf", "--kernels", "rope"], "use it with --path native"),
        (["--data", "missing.jsonl"], "no such file"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--compile", "--compile-mode", "max-autotune"], "unknown compile mode 'max-autotune'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(train_zoo, assay_cli, tmp_path, args, message):
    completed = assay_cli("train", "--model", str(train_zoo / "qwen3"), "--steps", "1", *args, cwd=tmp_path)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr
    assert message in lines[0]


def test_unknown_checkpoint_is_one_line_and_exit_2(tmp_path, assay_cli):
    completed = assay_cli("train", "--model", str(tmp_path / "nowhere"), "--steps", "1")
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [f"error: no checkpoint at {tmp_path / 'nowhere'}: not a file or folder"]


def test_plot_of_a_missing_file_is_one_line_and_exit_2(tmp_path, assay_cli):
    completed = assay_cli("plot", str(tmp_path / "absent.jsonl"), "-o", str(tmp_path / "x.png"))
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [f"error: no metrics file at {tmp_path / 'absent.jsonl'}"]


@pytest.mark.slow
def test_resume_says_which_step_it_resumed_from(train_zoo, tmp_path, assay_cli):
    args = ["train", "--model", str(train_zoo / "qwen3"), "--path", "native", "--seq-len", "32", "--batch", "2",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2", "--json"]
    first = assay_cli(*args, "--steps", "2")
    assert first.returncode == 0, first.stderr
    assert "resumed from" not in first.stderr
    resumed = assay_cli(*args, "--steps", "3", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step 2 ({tmp_path / 'ckpt' / 'step-000002'}); training steps 3-3" in resumed.stderr.splitlines()
    assert [r["step"] for r in json.loads(resumed.stdout)["records"]] == [3]  # stdout is still the JSON alone
