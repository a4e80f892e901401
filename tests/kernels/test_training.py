"""Training with kernel replacements gives the losses of training without them (("train_loss", dtype)
tolerance), from Python and through `assay train --path native --kernels ...`."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from assay.core.numerics import compare
from assay.core.metrics import read_jsonl
from assay.kernels.registry import apply_kernels
from assay.models.qwen3 import FLAVOURS, Qwen3

STEPS = 4


def train_losses(model: torch.nn.Module, vocab_size: int, steps: int = STEPS) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    # One batch of random tokens, seen every step: the loss must fall (memorisation), so the curve compared is a real one.
    tokens = torch.randint(0, vocab_size, (2, 17), generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour, names, dtype",
    [
        ("tiny", ["rope", "attention"], torch.float32),
        ("tiny-moe", ["rope", "grouped_experts", "attention"], torch.float32),
        ("tiny-moe", ["rope", "grouped_experts", "attention"], torch.bfloat16),
    ],
)
def test_training_with_kernels_gives_the_losses_of_training_without(caplog, flavour, names, dtype):
    args = replace(FLAVOURS[flavour], n_layers=3, max_seq_len=32)
    plain = Qwen3.build(args, dtype=dtype, seed=0)
    with_kernels = Qwen3.build(args, dtype=dtype, seed=0)
    with caplog.at_level(logging.INFO, logger="assay.kernels"):
        replacements = apply_kernels(with_kernels, names)
    lines = [rec.getMessage() for rec in caplog.records if "kernels: replaced layers." in rec.getMessage()]
    for name in names:  # one replacement per layer and kernel, each on its own start-up line
        assert sum(f"({name})" in line for line in lines) == args.n_layers
    assert len(replacements) == len(lines) == args.n_layers * len(names)

    expected = train_losses(plain, args.vocab_size)
    got = train_losses(with_kernels, args.vocab_size)
    result = compare("train_loss", torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), dtype)
    assert result.ok, (got, expected, result)
    assert expected[-1] < expected[0]  # it trained


def _train_cli(assay_cli, checkpoint, tmp_path, name: str, *extra: str):
    metrics = tmp_path / f"{name}.jsonl"
    result = assay_cli(
        "train", "--model", str(checkpoint), "--path", "native", "--steps", "3", "--batch", "2", "--seq-len", "32",
        "--metrics", str(metrics), *extra,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result, [record["loss"] for record in read_jsonl(metrics)]


@pytest.mark.slow
def test_assay_train_with_rope_logs_one_replacement_per_layer_and_matches_losses(zoo_dir, tmp_path, assay_cli):
    checkpoint = zoo_dir / "qwen3"
    n_layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    result, with_rope = _train_cli(assay_cli, checkpoint, tmp_path, "rope", "--kernels", "rope")
    lines = [line for line in result.stderr.splitlines() if line.startswith("kernels: replaced layers.")]
    assert lines == [f"kernels: replaced layers.{i}.attention.rope: RotaryEmbedding -> KernelRotaryEmbedding (rope)" for i in range(n_layers)]
    assert f"kernels: replaced {n_layers} module(s): rope x{n_layers}" in result.stderr
    _, plain = _train_cli(assay_cli, checkpoint, tmp_path, "plain")
    assert len(with_rope) == len(plain) == 3
    assert compare("train_loss", torch.tensor(with_rope), torch.tensor(plain), torch.float32).ok, (with_rope, plain)


@pytest.mark.slow
def test_assay_train_kernels_dry_run_with_a_filter_on_the_moe_checkpoint(zoo_dir, assay_cli):
    result = assay_cli(
        "train", "--model", str(zoo_dir / "qwen3-moe"), "--path", "native", "--kernels", "rope,grouped_experts",
        "--kernels-filter", "layers.0.*", "--kernels-dry-run",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("kernels: would replace")]
    assert lines == [
        "kernels: would replace layers.0.attention.rope: RotaryEmbedding -> KernelRotaryEmbedding (rope)",
        "kernels: would replace layers.0.moe.experts: GroupedExperts -> KernelGroupedExperts (grouped_experts)",
        "kernels: would replace 2 module(s): rope x1, grouped_experts x1",
    ]


@pytest.mark.slow
def test_assay_train_kernel_filter_matching_nothing_is_a_usage_error(zoo_dir, assay_cli):
    result = assay_cli("train", "--model", str(zoo_dir / "qwen3"), "--path", "native", "--kernels", "rope", "--kernels-filter", "layers.99.*")
    assert result.returncode == 2
    assert "kernel filter 'layers.99.*' matches no module" in result.stderr
