"""`torchrun -m assay train` on CPU with gloo: FSDP2 (--dp-shard), TP (--tp) and both on one DeviceMesh
give the single-process losses within the ("train_loss", float32) tolerance: relative error <= 1e-4."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from assay.core.numerics import assert_close
from assay.train import TrainRequest, train

STEPS, BATCH, SEQ_LEN = 3, 4, 32


@pytest.fixture(scope="module")
def single_process(train_zoo) -> dict[str, list[float]]:
    return {
        path: train(TrainRequest(model=str(train_zoo / "qwen3"), path=path, steps=STEPS, batch=BATCH, seq_len=SEQ_LEN)).losses
        for path in ("native", "hf")
    }


def launch(torchrun, processes: int, model, *flags: str) -> dict:
    completed = torchrun(processes, "train", "--model", str(model), "--steps", str(STEPS), "--batch", str(BATCH),
                         "--seq-len", str(SEQ_LEN), "--json", *flags)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    return json.loads(completed.stdout)  # rank 0 alone prints


@pytest.mark.distributed
@pytest.mark.parametrize(
    "processes, flags, layout",
    [(2, ["--dp-shard", "2"], (2, 1)), (2, ["--tp", "2"], (1, 2)), (4, ["--dp-shard", "2", "--tp", "2"], (2, 2))],
    ids=["fsdp2", "tp2", "fsdp2xtp2"],
)
def test_native_sharded_losses_match_single_process(train_zoo, torchrun, single_process, processes, flags, layout):
    result = launch(torchrun, processes, train_zoo / "qwen3", *flags)
    summary = result["summary"]
    assert (summary["world_size"], summary["dp_shard"], summary["tp"]) == (processes, *layout)
    losses = [record["loss"] for record in result["records"]]
    assert_close("train_loss", torch.tensor(losses), torch.tensor(single_process["native"]), torch.float32)


@pytest.mark.distributed
def test_hf_path_under_fsdp_matches_single_process_and_exports(train_zoo, torchrun, single_process, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    result = launch(torchrun, 2, train_zoo / "qwen3", "--path", "hf", "--dp-shard", "2", "--export-hf", str(out))
    losses = [record["loss"] for record in result["records"]]
    assert_close("train_loss", torch.tensor(losses), torch.tensor(single_process["hf"]), torch.float32)
    # rank 0 gathered the shards: the export is the whole model
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert sum(p.numel() for p in reloaded.parameters()) == result["summary"]["params_total"]


@pytest.mark.distributed
def test_checkpoint_written_sharded_resumes_in_one_process(train_zoo, torchrun, single_process, tmp_path):
    """DCP stores each rank's shard with its layout: an FSDP checkpoint resumes unsharded, losses unchanged."""
    checkpoints = tmp_path / "ckpt"
    launch(torchrun, 2, train_zoo / "qwen3", "--dp-shard", "2", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2")
    shutil.rmtree(checkpoints / "step-000003")  # as if killed after step 2's checkpoint
    resumed = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=STEPS, batch=BATCH, seq_len=SEQ_LEN,
                                 checkpoint_dir=checkpoints, resume=True))
    assert [r["step"] for r in resumed.records] == [3]
    assert_close("train_loss", torch.tensor(resumed.losses), torch.tensor(single_process["native"][2:]), torch.float32)
