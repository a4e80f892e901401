"""The trainer on the GLA family (model_type "gla"): `assay train --model zoo/gla --path native`,
the initialisation check, export back to fla's layout, the gla_chunk kernel, and TP=2 under torchrun."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from assay.core.numerics import assert_close
from assay.models import registry
from assay.models.gla import SPEC
from assay.train import TrainRequest, train

STEPS, BATCH, SEQ_LEN = 3, 4, 64


def test_gla_family_is_registered_by_model_type():
    family = registry.for_model_type("gla")
    assert family.name == "gla" and "3B" in family.flavours and "tiny" in family.flavours


@pytest.mark.slow
def test_cli_trains_zoo_gla_natively_with_finite_loss(train_zoo, assay_cli):
    result = assay_cli("train", "--model", str(train_zoo / "gla"), "--path", "native", "--steps", "3", "--seq-len", "64", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    losses = [record["loss"] for record in report["records"]]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert report["summary"]["family"] == "gla" and report["summary"]["model_type"] == "gla"
    assert all(math.isfinite(record["grad_norm"]) and record["tokens_per_s"] > 0 for record in report["records"])


def test_pretrained_gla_passes_check_init_and_exports_to_fla_layout(train_zoo, tmp_path):
    out = tmp_path / "export"
    result = train(TrainRequest(model=str(train_zoo / "gla-pretrained"), path="native", steps=2, batch=BATCH, seq_len=SEQ_LEN,
                                check_init=True, export_hf=out))
    assert result.check_init.weights_loaded, result.check_init.verdict
    assert result.check_init.loaded_loss < 0.7 * result.check_init.ln_vocab
    exported, args = SPEC.load(out)
    trained = result.model.model
    tokens = torch.randint(0, args.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(tokens), trained(tokens))
    assert (out / "tokenizer.json").is_file() and json.loads((out / "config.json").read_text())["model_type"] == "gla"


def test_gla_chunk_kernel_trains_to_the_same_losses(train_zoo):
    request = TrainRequest(model=str(train_zoo / "gla"), path="native", steps=STEPS, batch=BATCH, seq_len=SEQ_LEN)
    plain = train(request).losses
    with_kernel = train(replace(request, kernels=("gla_chunk",)))
    assert with_kernel.kernels == [f"layers.{i}.attention.gla: GLAOperator -> KernelGLAOperator (gla_chunk)" for i in range(2)]
    assert_close("train_loss", torch.tensor(with_kernel.losses), torch.tensor(plain), torch.float32)


@pytest.mark.distributed
def test_gla_tensor_parallel_losses_match_single_process(train_zoo, torchrun):
    single = train(TrainRequest(model=str(train_zoo / "gla"), path="native", steps=STEPS, batch=BATCH, seq_len=SEQ_LEN)).losses
    completed = torchrun(2, "train", "--model", str(train_zoo / "gla"), "--steps", str(STEPS), "--batch", str(BATCH),
                         "--seq-len", str(SEQ_LEN), "--tp", "2", "--json")
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    result = json.loads(completed.stdout)
    assert (result["summary"]["world_size"], result["summary"]["tp"]) == (2, 2)
    assert_close("train_loss", torch.tensor([r["loss"] for r in result["records"]]), torch.tensor(single), torch.float32)
