"""DCP checkpoints: atomic step folders, exact resume (weights, optimizer, LR schedule, data position,
RNG), and a NaN/inf run that stops with exit 1 and keeps the last good checkpoint."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.metrics import read_jsonl
from assay.train import OptimConfig, TrainRequest, train
from assay.train.checkpoint import STATE_FILE, complete_checkpoints, latest_checkpoint, load_checkpoint
from assay.train.distributed import Layout
from assay.train.model_paths import ModelChoice, load_model
from assay.train.optimization import build_optimizer

ONE_PROCESS = Layout(world_size=1, rank=0, local_rank=0, dp_shard=1, tp=1)


def request(train_zoo, tmp_path, **overrides) -> TrainRequest:
    base = dict(
        model=str(train_zoo / "qwen3"), steps=6, batch=2, seq_len=32, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=3,
        metrics=tmp_path / "run.jsonl", optim=OptimConfig(warmup_steps=2),
    )
    return TrainRequest(**(base | overrides))


def test_resume_continues_exactly_like_an_uninterrupted_run(train_zoo, tmp_path):
    uninterrupted = train(request(train_zoo, tmp_path))
    assert [p.name for p in complete_checkpoints(tmp_path / "ckpt")] == ["step-000003", "step-000006"]
    # As if the run had been killed after the step-3 checkpoint.
    shutil.rmtree(tmp_path / "ckpt" / "step-000006")
    resumed = train(request(train_zoo, tmp_path, resume=True))
    assert [r["step"] for r in resumed.records] == [4, 5, 6]
    # Bit-identical on CPU: weights, AdamW moments, LR schedule position, data position all restored.
    assert resumed.losses == uninterrupted.losses[3:]
    assert [r["lr"] for r in resumed.records] == [r["lr"] for r in uninterrupted.records[3:]]
    assert [r["tokens_seen"] for r in resumed.records] == [r["tokens_seen"] for r in uninterrupted.records[3:]]
    # The metrics file holds each step once: steps 1-3 from the first run, 4-6 from the resumed one.
    assert [r["step"] for r in read_jsonl(tmp_path / "run.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in read_jsonl(tmp_path / "run.jsonl")] == uninterrupted.losses


def test_loading_a_checkpoint_restores_the_rng_state(train_zoo, tmp_path):
    train(request(train_zoo, tmp_path, steps=3))
    saved = torch.load(tmp_path / "ckpt" / "step-000003" / "rng-rank0.pt", weights_only=True)["cpu"]
    loaded = load_model(ModelChoice(str(train_zoo / "qwen3")), torch.device("cpu"), torch.float32)
    optimizer, _ = build_optimizer(loaded.model, OptimConfig(), 3)
    torch.manual_seed(1234)
    load_checkpoint(tmp_path / "ckpt" / "step-000003", loaded.model, optimizer, ONE_PROCESS)
    assert torch.equal(torch.get_rng_state(), saved)


def test_an_unfinished_checkpoint_folder_is_never_resumed(train_zoo, tmp_path):
    train(request(train_zoo, tmp_path, steps=3))
    # A run killed while writing step 6 leaves only its staging folder.
    staging = tmp_path / "ckpt" / ".step-000006.tmp"
    staging.mkdir()
    (staging / "__0_0.distcp").write_bytes(b"half a file")
    assert latest_checkpoint(tmp_path / "ckpt").name == "step-000003"
    resumed = train(request(train_zoo, tmp_path, resume=True))
    assert resumed.records[0]["step"] == 4
    # Writing step 6 again replaced the leftover; the finished folder is complete.
    assert not staging.exists()
    assert (tmp_path / "ckpt" / "step-000006" / STATE_FILE).is_file()


def test_resume_of_a_different_run_is_refused(train_zoo, tmp_path):
    train(request(train_zoo, tmp_path, steps=3))
    with pytest.raises(AssayError, match=r"different run \(seq_len: 32 -> 16\)"):
        train(request(train_zoo, tmp_path, seq_len=16, resume=True))


def test_resume_with_no_checkpoint_is_a_clear_error(train_zoo, tmp_path):
    with pytest.raises(AssayError, match="no complete checkpoint"):
        train(request(train_zoo, tmp_path, resume=True))


@pytest.mark.slow
def test_nan_loss_stops_with_exit_1_and_keeps_the_last_good_checkpoint(train_zoo, tmp_path, assay_cli):
    checkpoints = tmp_path / "ckpt"
    metrics = tmp_path / "run.jsonl"
    completed = assay_cli(
        "train", "--model", str(train_zoo / "qwen3"), "--steps", "10", "--seq-len", "32", "--lr", "1e6",
        "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1", "--metrics", str(metrics),
    )
    assert completed.returncode == 1, completed.stderr
    error = completed.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "nan" in error and "training stopped" in error
    records = read_jsonl(metrics)
    failed_step = records[-1]["step"]
    assert "stopped" in records[-1] and failed_step < 10
    last_good = latest_checkpoint(checkpoints)
    assert f"last good checkpoint: {last_good}" in error
    assert json.loads((last_good / STATE_FILE).read_text())["step"] == failed_step - 1
    assert all(math.isfinite(r["loss"]) for r in records[:-1])

    # The kept checkpoint holds finite weights and loads into the model.
    loaded = load_model(ModelChoice(str(train_zoo / "qwen3")), torch.device("cpu"), torch.float32)
    optimizer, _ = build_optimizer(loaded.model, OptimConfig(), 10)
    load_checkpoint(last_good, loaded.model, optimizer, ONE_PROCESS)
    assert all(torch.isfinite(p).all() for p in loaded.model.parameters())
