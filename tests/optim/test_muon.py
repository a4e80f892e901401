"""Muon: equal to torch.optim.Muon on one device, equal to itself single-process when FSDP2-sharded.

The sharded checks run on 2 real gloo ranks (assay.core.distributed.run_on_ranks), once for the
module: each rank returns what it measured and the tests below assert on it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from assay.core.distributed import run_on_ranks
from assay.core.errors import AssayError
from assay.core.numerics import assert_close, rel_error, tolerance
from assay.optim import Muon, split_params
from assay.optim.distributed_muon import WIRE_DTYPE, assign_owners, fsdp_rows

VOCAB, WIDTH = 50, 24
WORLD = 2
STEPS = 3


class TinyLM(nn.Module):
    """Embedding, norm, four hidden matrices (33 and 7 rows: uneven shards), biases, an output head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 33)
        self.down = nn.Linear(33, WIDTH, bias=False)
        self.narrow = nn.Linear(WIDTH, 7, bias=False)
        self.widen = nn.Linear(7, WIDTH, bias=False)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):  # tokens: [B, T] -> logits [B, T, VOCAB]
        hidden = self.embed(tokens)
        hidden = hidden + self.down(F.gelu(self.up(self.norm(hidden))))
        hidden = hidden + self.widen(self.narrow(hidden))
        return self.lm_head(hidden)


HIDDEN = ["up.weight", "down.weight", "narrow.weight", "widen.weight"]


def _random_grads(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return {name: torch.randn(param.shape, generator=generator) for name, param in model.named_parameters()}


def test_split_puts_hidden_matrices_on_muon_and_the_rest_on_adamw():
    muon, adamw = split_params(TinyLM())
    assert [name for name, _ in muon] == HIDDEN
    assert [name for name, _ in adamw] == ["embed.weight", "norm.weight", "norm.bias", "up.bias", "lm_head.weight"]


def test_one_device_update_equals_torch_muon():
    torch.manual_seed(0)
    matrices = [torch.randn(33, 24), torch.randn(24, 33), torch.randn(7, 24)]
    ours = [m.clone().requires_grad_() for m in matrices]
    theirs = [m.clone().requires_grad_() for m in matrices]
    optimizer = Muon(ours, lr=0.02)
    reference = torch.optim.Muon(theirs, lr=0.02)
    for step in range(4):
        generator = torch.Generator().manual_seed(step)
        for mine, other in zip(ours, theirs):
            grad = torch.randn(mine.shape, generator=generator)
            mine.grad, other.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
        for mine, other in zip(ours, theirs):
            assert_close("optimizer_update", mine, other, torch.float32)
            assert torch.equal(mine, other)  # same operations in the same order: bit for bit


@pytest.mark.parametrize("nesterov,adjust_lr_fn", [(False, "match_rms_adamw"), (True, "original")])
def test_one_device_options_equal_torch_muon(nesterov, adjust_lr_fn):
    matrix = torch.randn(40, 12, generator=torch.Generator().manual_seed(3))
    ours, theirs = matrix.clone().requires_grad_(), matrix.clone().requires_grad_()
    options = dict(lr=0.05, weight_decay=0.01, momentum=0.9, nesterov=nesterov, ns_steps=4, adjust_lr_fn=adjust_lr_fn)
    optimizer, reference = Muon([ours], **options), torch.optim.Muon([theirs], **options)
    for step in range(3):
        grad = torch.randn(matrix.shape, generator=torch.Generator().manual_seed(10 + step))
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert torch.equal(ours, theirs)


def test_adamw_groups_equal_torch_adamw():
    model, twin = TinyLM(), TinyLM()
    twin.load_state_dict(model.state_dict())
    optimizer = Muon.for_model(model, lr=0.02, adamw_lr=0.01, adamw_betas=(0.9, 0.95), adamw_weight_decay=0.1)
    _, adamw_params = split_params(twin)
    reference = torch.optim.AdamW([p for _, p in adamw_params], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(3):
        grads = _random_grads(model, step)
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        for name, param in adamw_params:
            param.grad = grads[name].clone()
        optimizer.step()
        reference.step()
    twin_params = dict(twin.named_parameters())
    for name, param in split_params(model)[1]:
        assert torch.equal(param, twin_params[name]), name


def test_one_optimizer_object_holds_both_kinds():
    optimizer = Muon.for_model(TinyLM())
    assert [group["use_muon"] for group in optimizer.param_groups] == [True, False]
    assert optimizer.param_groups[1]["betas"] == (0.9, 0.999)  # AdamW keys on the AdamW group


def test_non_matrix_in_a_muon_group_is_assay_error():
    with pytest.raises(AssayError, match="2-D hidden matrices"):
        Muon([torch.zeros(3, requires_grad=True)])


def test_bad_exchange_is_assay_error():
    with pytest.raises(AssayError, match="exchange"):
        Muon([torch.zeros(3, 3, requires_grad=True)], exchange="broadcast")


# ---- sharded: one launch of WORLD gloo ranks, shared by the tests below ----


def _sharded_checks() -> dict:
    """On each rank: FSDP2-sharded Muon vs the same Muon on a full copy of the model, per exchange."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    report = {}
    for exchange in ("all_to_all", "all_gather"):
        torch.manual_seed(0)
        model = TinyLM()
        reference = copy.deepcopy(model)
        fully_shard(model, mesh=mesh)
        optimizer = Muon.for_model(model, lr=0.02, adamw_lr=0.01, exchange=exchange)
        ref_optimizer = Muon.for_model(reference, lr=0.02, adamw_lr=0.01)
        ref_params = dict(reference.named_parameters())
        update_errors, exact = {}, True
        for step in range(STEPS):
            grads = _random_grads(reference, step)
            before = {name: param.full_tensor() for name, param in model.named_parameters()}
            ref_before = {name: param.detach().clone() for name, param in ref_params.items()}
            for name, param in model.named_parameters():
                param.grad = distribute_tensor(grads[name], mesh, [Shard(0)])
                ref_params[name].grad = grads[name].clone()
            optimizer.step()
            ref_optimizer.step()
            for name, param in model.named_parameters():
                after = param.full_tensor()
                update, ref_update = after - before[name], ref_params[name].detach() - ref_before[name]
                update_errors[name] = max(update_errors.get(name, 0.0), rel_error(update, ref_update))
                exact = exact and torch.equal(after, ref_params[name].detach())
        report[exchange] = {"update_errors": update_errors, "exact": exact, "comm": optimizer.comm_stats.as_dict()}

    # End to end: real FSDP2 forward/backward on this rank's share of the batch vs the full batch.
    torch.manual_seed(0)
    model = TinyLM()
    reference = copy.deepcopy(model)
    fully_shard(model, mesh=mesh)
    optimizer, ref_optimizer = Muon.for_model(model, lr=0.02, adamw_lr=0.01), Muon.for_model(reference, lr=0.02, adamw_lr=0.01)
    rank, losses, ref_losses = dist.get_rank(), [], []
    tokens = torch.randint(0, VOCAB, (4 * world, 9), generator=torch.Generator().manual_seed(0))  # one batch, memorised
    for _ in range(STEPS):
        mine = tokens[4 * rank : 4 * (rank + 1)]
        loss = F.cross_entropy(model(mine[:, :-1]).flatten(0, 1), mine[:, 1:].flatten())
        loss.backward()
        ref_loss = F.cross_entropy(reference(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        ref_loss.backward()
        optimizer.step()
        ref_optimizer.step()
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
        ref_losses.append(ref_loss.item())
    report["training"] = {"losses": losses, "ref_losses": ref_losses}
    return report


@pytest.fixture(scope="module")
def sharded_reports() -> list[dict]:
    return run_on_ranks(_sharded_checks, world_size=WORLD, timeout_s=300)


@pytest.mark.distributed
@pytest.mark.parametrize("exchange", ["all_to_all", "all_gather"])
def test_sharded_updates_equal_single_process(sharded_reports, exchange):
    for rank, report in enumerate(sharded_reports):
        for name, error in report[exchange]["update_errors"].items():
            assert error <= tolerance("optimizer_update", torch.float32), f"rank {rank} {name}: {error:.2e}"
        # bfloat16 on the wire is what Newton-Schulz rounds to anyway: the results are bit-identical.
        assert report[exchange]["exact"], f"rank {rank}"


@pytest.mark.distributed
def test_all_to_all_bytes_are_counted_per_rank(sharded_reports):
    model = TinyLM()
    shapes = [tuple(dict(model.named_parameters())[name].shape) for name in HIDDEN]
    owners = assign_owners(shapes, WORLD)
    for rank, report in enumerate(sharded_reports):
        comm = report["all_to_all"]["comm"]
        mine = [fsdp_rows(rows, WORLD)[rank] * cols for rows, cols in shapes]
        # Exchange 1 sends my rows of matrices owned elsewhere and receives the others' rows of mine;
        # exchange 2 is its mirror image.
        sent_first = sum(n for n, owner in zip(mine, owners) if owner != rank)
        received_first = sum(rows * cols - n for (rows, cols), n, owner in zip(shapes, mine, owners) if owner == rank)
        per_step = (sent_first + received_first) * WIRE_DTYPE.itemsize
        assert comm["steps"] == STEPS
        assert comm["sent_bytes"] == comm["received_bytes"] == STEPS * per_step
        assert comm["naive_received_bytes"] == STEPS * sum(rows * cols - n for (rows, cols), n in zip(shapes, mine)) * WIRE_DTYPE.itemsize
        assert comm["newton_schulz_matrices"] == STEPS * owners.count(rank)
    # Every matrix is orthogonalised exactly once per step, somewhere.
    assert sum(r["all_to_all"]["comm"]["newton_schulz_matrices"] for r in sharded_reports) == STEPS * len(HIDDEN)


@pytest.mark.distributed
def test_all_gather_moves_what_the_naive_count_says(sharded_reports):
    for report in sharded_reports:
        comm = report["all_gather"]["comm"]
        assert comm["received_bytes"] == comm["naive_received_bytes"] > 0
        assert comm["sent_bytes"] == comm["naive_sent_bytes"]
        assert comm["newton_schulz_matrices"] == STEPS * len(HIDDEN)  # every rank does every matrix


@pytest.mark.distributed
def test_fsdp_training_loss_matches_single_process(sharded_reports):
    for report in sharded_reports:
        losses = torch.tensor(report["training"]["losses"], dtype=torch.float64)
        ref_losses = torch.tensor(report["training"]["ref_losses"], dtype=torch.float64)
        assert_close("train_loss", losses, ref_losses, torch.float32)
        assert losses[-1] < losses[0]  # it trains
