"""Exact resume after a real crash: `assay train` SIGKILLed at an exact point (the ASSAY_TEST_KILL_AT hook,
no timing), then `--resume`, reaches the per-step losses of a run that was never killed, bit for bit on CPU.

Two points: mid-step (step 5, after backward, before the optimizer step) and mid-checkpoint-write
(checkpoint 6, after the DCP shards are on disk, before the commit). Checkpoints every 3 of 8 steps, so
both resume from step-3: the mid-write kill leaves a staging folder that the resume names and ignores.
The hf and native paths in one process at both points, and the native path under FSDP on 2 gloo ranks killed
mid-write."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.metrics import read_jsonl
from assay.train import OptimConfig
from assay.train.checkpoint import STATE_FILE, complete_checkpoints, incomplete_checkpoints, latest_checkpoint, load_checkpoint
from assay.train.crash_points import KILL_ENV, kill_target
from assay.train.distributed import Layout
from assay.train.model_paths import ModelChoice, load_model
from assay.train.optimization import build_optimizer

STEPS, EVERY = 8, 3
RUN_FLAGS = ("--steps", str(STEPS), "--batch", "4", "--seq-len", "32", "--warmup-steps", "2", "--checkpoint-every", str(EVERY), "--json")
KILLS = {"mid-step": "step:5", "mid-checkpoint-write": "checkpoint:6"}
SIGKILL_STATUS = -9


def bits(records: list[dict], key: str) -> list[bytes]:
    """The float64 bits of each record's value (the metrics hold the float32 loss exactly as a double)."""
    return [struct.pack("<d", record[key]) for record in records]


def train_args(model, out, *extra: str) -> list[str]:
    return ["train", "--model", str(model), *RUN_FLAGS, "--checkpoint-dir", str(out / "ckpt"), "--metrics", str(out / "run.jsonl"), *extra]


def assert_same_run(resumed_metrics, unbroken_metrics) -> None:
    resumed, unbroken = read_jsonl(resumed_metrics), read_jsonl(unbroken_metrics)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # each step once: nothing lost, nothing doubled
    for key in ("loss", "grad_norm", "lr"):
        assert bits(resumed, key) == bits(unbroken, key), key
    assert [r["tokens_seen"] for r in resumed] == [r["tokens_seen"] for r in unbroken]


def assert_killed_as_planned(kill: str, folder, records: list[dict]) -> None:
    """What the crash left: step-3 complete; a mid-write kill also leaves step-6's uncommitted staging folder."""
    assert [path.name for path in complete_checkpoints(folder)] == ["step-000003"]
    if kill == "mid-step":
        assert [r["step"] for r in records] == [1, 2, 3, 4]  # step 5 died before its record
        assert incomplete_checkpoints(folder) == []
    else:
        assert [r["step"] for r in records] == list(range(1, 7))
        [(step, staging)] = incomplete_checkpoints(folder)
        assert (step, staging.name) == (6, ".step-000006.tmp")
        assert any(staging.glob("*.distcp")) and not (staging / STATE_FILE).exists()  # shards written, never committed


@pytest.fixture(scope="module")
def unbroken(train_zoo, tmp_path_factory):
    """One uninterrupted run per path: the reference every resumed run must equal."""
    from helpers.cli import run_assay

    runs = {}
    for path in ("native", "hf"):
        out = tmp_path_factory.mktemp(f"unbroken-{path}")
        completed = run_assay(*train_args(train_zoo / "qwen3", out, "--path", path))
        assert completed.returncode == 0, completed.stderr[-3000:]
        runs[path] = out / "run.jsonl"
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kill", list(KILLS))
@pytest.mark.parametrize("path", ["native", "hf"])
def test_resume_after_sigkill_reaches_the_unbroken_losses_bit_for_bit(train_zoo, unbroken, assay_cli, assay_process, tmp_path, path, kill):
    args = train_args(train_zoo / "qwen3", tmp_path, "--path", path)
    killed = assay_process(*args, env={KILL_ENV: KILLS[kill]})
    assert killed.returncode == SIGKILL_STATUS, killed.stderr[-3000:]
    assert_killed_as_planned(kill, tmp_path / "ckpt", read_jsonl(tmp_path / "run.jsonl"))

    resumed = assay_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in json.loads(resumed.stdout)["records"]] == list(range(4, STEPS + 1))
    warnings = [line for line in resumed.stderr.splitlines() if line.startswith("warning: checkpoint")]
    if kill == "mid-checkpoint-write":
        assert warnings == [f"warning: checkpoint step-000006 is incomplete (killed while writing?): {tmp_path / 'ckpt' / '.step-000006.tmp'} "
                            "ignored; resuming from step-000003"]
    else:
        assert warnings == []
    assert_same_run(tmp_path / "run.jsonl", unbroken[path])
    assert [p.name for p in complete_checkpoints(tmp_path / "ckpt")] == ["step-000006", "step-000008"]
    assert incomplete_checkpoints(tmp_path / "ckpt") == []  # step 6 written again: the leftover replaced


@pytest.mark.slow
def test_a_checkpoint_killed_mid_write_leaves_the_previous_one_loadable(train_zoo, assay_process, tmp_path):
    killed = assay_process(*train_args(train_zoo / "qwen3", tmp_path), env={KILL_ENV: "checkpoint:6"})
    assert killed.returncode == SIGKILL_STATUS, killed.stderr[-3000:]
    previous = latest_checkpoint(tmp_path / "ckpt")
    assert previous.name == "step-000003"
    loaded = load_model(ModelChoice(str(train_zoo / "qwen3")), torch.device("cpu"), torch.float32)
    optimizer, _ = build_optimizer(loaded.model, OptimConfig(), STEPS)
    state = load_checkpoint(previous, loaded.model, optimizer, Layout(world_size=1, rank=0, local_rank=0, dp_shard=1, tp=1))
    assert state["step"] == 3 and all(torch.isfinite(p).all() for p in loaded.model.parameters())


def test_a_malformed_kill_hook_is_an_error_not_a_silent_no_op(monkeypatch):
    monkeypatch.setenv(KILL_ENV, "step5")
    with pytest.raises(AssayError, match="expected POINT:STEP"):
        kill_target()
    monkeypatch.setenv(KILL_ENV, "checkpoint:6@1")
    assert kill_target() == ("checkpoint", 6, 1)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_resume_after_sigkill_reaches_the_unbroken_losses_bit_for_bit(train_zoo, torchrun, tmp_path):
    """2 gloo ranks, --dp-shard 2, every rank killed mid-checkpoint-write (each rank's own SIGKILL: which rank
    torchrun notices first does not matter), the kill that leaves each rank's DCP shards in a staging folder.
    The resume equals the unbroken 2-rank run bit for bit. (A mid-step kill resumes through the same code as
    this one, from the same step-3 checkpoint: the single-process tests above kill both paths there.)"""
    model = train_zoo / "qwen3"
    reference = tmp_path / "unbroken"
    completed = torchrun(2, *train_args(model, reference, "--dp-shard", "2"))
    assert completed.returncode == 0, completed.stderr[-4000:]

    out = tmp_path / "killed"
    args = train_args(model, out, "--dp-shard", "2")
    killed = torchrun(2, *args, env={KILL_ENV: KILLS["mid-checkpoint-write"]})
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-4000:]
    assert_killed_as_planned("mid-checkpoint-write", out / "ckpt", read_jsonl(out / "run.jsonl"))
    resumed = torchrun(2, *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "step-000006 is incomplete (killed while writing?)" in resumed.stderr
    assert_same_run(out / "run.jsonl", reference / "run.jsonl")
