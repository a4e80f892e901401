"""The trainer's speed and memory options keep the numbers: the chunked loss, activation checkpointing,
foreach gradient clipping, the fused optimizer, and --compile with inductor (no graph break).

Tolerances: the chunked loss against a float64 full-logits reference, 1e-6 relative (float32 logits
over a 1,024-token vocabulary: rounding of the logsumexp only); whole runs against each other within
("train_loss", float32) = 1e-4 relative (core.numerics), the trainer's tolerance across paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from assay.core.numerics import assert_close
from assay.train import TrainRequest, train
from assay.train.data import IGNORE_INDEX
from assay.train.loss import chunk_tokens_for, chunked_linear_cross_entropy
from assay.train.optimization import adamw_implementation, clip_grad_norm_tensor

REPO = Path(__file__).resolve().parents[2]


def test_chunked_loss_and_gradients_equal_the_full_logits_in_float64():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 37, 16, generator=generator, requires_grad=True)
    weight = torch.randn(1024, 16, generator=generator, requires_grad=True)
    labels = torch.randint(0, 1024, (2, 37), generator=generator)
    labels[0, :5] = IGNORE_INDEX  # ignored positions leave the mean and the gradients
    loss = chunked_linear_cross_entropy(hidden, weight, labels, chunk_tokens=10)  # 74 tokens: 8 chunks, the last short
    loss.backward()
    hidden64, weight64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    reference = F.cross_entropy((hidden64 @ weight64.T).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    reference.backward()
    assert abs(loss.item() - reference.item()) <= 1e-6 * reference.item()
    for grad, grad64 in ((hidden.grad, hidden64.grad), (weight.grad, weight64.grad)):
        assert ((grad.double() - grad64).abs().max() / grad64.abs().max()).item() <= 1e-5


def test_loss_chunks_automatically_only_for_a_large_vocabulary():
    assert chunk_tokens_for(None, 2048, 1024) == 0  # the zoo: 8 MB of logits, unchunked
    chunk = chunk_tokens_for(None, 1024, 151_936)  # Qwen3: 622 MB of logits
    assert 0 < chunk < 1024 and chunk % 64 == 0
    assert chunk_tokens_for(0, 1024, 151_936) == 0 and chunk_tokens_for(100, 10, 10) == 100


@pytest.mark.parametrize("path", ["native", "hf"])
def test_chunked_loss_trains_like_the_full_logits(train_zoo, path):
    model = str(train_zoo / "qwen3")  # tied embeddings: the head's gradient also reaches the embedding
    full = train(TrainRequest(model=model, path=path, steps=3, seq_len=32, loss_chunk_tokens=0))
    chunked = train(TrainRequest(model=model, path=path, steps=3, seq_len=32, loss_chunk_tokens=24))
    assert chunked.summary["loss_chunk_tokens"] == 24 and full.summary["loss_chunk_tokens"] == 0
    assert_close("train_loss", torch.tensor(chunked.losses), torch.tensor(full.losses), torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_trains_like_none_and_exports_every_key(train_zoo, tmp_path, mode):
    model = str(train_zoo / "qwen3-moe")
    plain = train(TrainRequest(model=model, steps=3, seq_len=32))
    checkpointed = train(TrainRequest(model=model, steps=3, seq_len=32, activation_checkpointing=mode, export_hf=tmp_path / "out"))
    assert checkpointed.summary["activation_checkpointing"] == mode
    assert_close("train_loss", torch.tensor(checkpointed.losses), torch.tensor(plain.losses), torch.float32)
    exported = load_file(tmp_path / "out" / "model.safetensors")
    original = load_file(train_zoo / "qwen3-moe" / "model.safetensors")
    assert set(exported) == set(original)  # the wrapper renames nothing


def test_activation_checkpointing_inside_compiled_blocks(train_zoo):
    model = str(train_zoo / "qwen3")
    eager = train(TrainRequest(model=model, steps=2, seq_len=32))
    compiled = train(TrainRequest(model=model, steps=2, seq_len=32, compile=True, backend="aot_eager", activation_checkpointing="selective"))
    assert_close("train_loss", torch.tensor(compiled.losses), torch.tensor(eager.losses), torch.float32)
    assert compiled.summary["compile"]["graph_breaks"] == 0


def test_unknown_activation_checkpointing_mode_is_one_line_exit_2(train_zoo, assay_cli):
    completed = assay_cli("train", "--model", str(train_zoo / "qwen3"), "--steps", "1", "--activation-checkpointing", "some", cwd=REPO)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == ["error: unknown --activation-checkpointing 'some' (one of none, full, selective)"]


def test_foreach_clipping_matches_torch_clip_grad_norm():
    torch.manual_seed(0)
    ours, theirs = (torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)), (torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    for a, b in zip(ours, theirs):
        b.load_state_dict(a.state_dict())
    for modules in (ours, theirs):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)) * 10
        modules[1](modules[0](x)).pow(2).sum().backward()
    params = [p for m in ours for p in m.parameters()]
    reference = torch.nn.utils.clip_grad_norm_([p for m in theirs for p in m.parameters()], 1.0)
    norm = clip_grad_norm_tensor(params, 1.0)
    assert abs(norm.item() - reference.item()) <= 1e-6 * reference.item()
    assert norm.item() > 1.0  # clipping happened
    for p, q in zip(params, [p for m in theirs for p in m.parameters()]):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=0)
    assert adamw_implementation(params) == "fused"


@pytest.mark.inductor
@pytest.mark.slow
def test_inductor_compiled_blocks_have_no_graph_break_and_report_compile_time(train_zoo):
    model = str(train_zoo / "qwen3")
    from assay.core.compiling import reset

    eager = train(TrainRequest(model=model, steps=3, seq_len=32))
    reset()  # counters below are for this run alone, whatever compiled earlier in the session
    compiled = train(TrainRequest(model=model, steps=3, seq_len=32, compile=True, backend="inductor"))
    stats = compiled.summary["compile"]
    assert stats["graph_breaks"] == 0 and stats["recompiles"] == 0, stats
    # The compiling step is timed apart: the warm-up phase, not part of the steady throughput.
    assert compiled.records[0]["warmup"] and compiled.summary["warmup_s"] > compiled.summary["steady_step_s_mean"]
    assert_close("train_loss", torch.tensor(compiled.losses), torch.tensor(eager.losses), torch.float32)


def test_moe_experts_grouped_mm_gives_the_per_expert_loops_bits():
    from assay.models.common.feed_forward import GroupedExperts

    generator = torch.Generator().manual_seed(0)
    experts = GroupedExperts(8, 64, 32)  # the zoo MoE's experts
    with torch.no_grad():
        for weight in experts.parameters():
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
    x = torch.randn(300, 64, generator=generator, requires_grad=True)
    top_k_weights, top_k_index = torch.topk(torch.softmax(torch.randn(300, 8, generator=generator), -1), 2)
    results = {}
    for grouped in (True, False):
        experts.use_grouped_mm = grouped
        assert experts._grouped_mm_fits(x) == grouped
        out = experts(x, top_k_index, top_k_weights)
        results[grouped] = (out, *torch.autograd.grad(out.square().sum(), [x, experts.w1, experts.w2, experts.w3]))
    # torch._grouped_mm on CPU runs the same per-group matmuls as F.linear: equal bits, forward and backward.
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False]))
