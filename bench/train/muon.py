"""Distributed Muon on CPU (gloo, FSDP2): bytes per rank and step time, all-to-all vs all-gather.

    python bench/train/muon.py            -> bench/results/muon.json and a table

The model is a stack of realistic hidden matrices (8 x [512, 512] + [1024, 512]), sharded by
fully_shard; every rank runs one process with one thread. "all_gather" is the naive way (every rank
gathers and orthogonalises every matrix), "all_to_all" the two-exchange way (each matrix to one
owner). Bytes are counted by the optimizer itself (Muon.comm_stats); each run also checks that the
sharded parameters end equal to a single-process Muon's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import copy
import os
import statistics
import time

import torch
from torch import nn

from assay.core.distributed import run_on_ranks
from assay.core.files import atomic_write_json
from assay.core.metrics import StepTimer
from assay.core.numerics import rel_error
from assay.core.output import print_table
from assay.optim import Muon
from assay.optim.distributed_muon import WIRE_DTYPE, assign_owners, fsdp_rows
from bench.common import RESULTS

SHAPES = [(512, 512)] * 8 + [(1024, 512)]
WORLD_SIZES = [2, 4]
EXCHANGES = ["all_gather", "all_to_all"]
# World sizes projected from the same plan (no processes): where the saving grows.
PROJECTED_WORLD_SIZES = [2, 4, 8, 16, 48, 64]
# ... for this block of matrices, and for 24 copies of it (a 24-layer model's count of matrices).
LAYERS_PROJECTED = 24


class HiddenMatrices(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(cols, rows, bias=False) for rows, cols in SHAPES)


def _grads(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return {name: torch.randn(param.shape, generator=generator) for name, param in model.named_parameters()}


def bench_rank(exchange: str, warmup: int, steps: int) -> dict:
    """On each rank: time Muon steps on the sharded model; check the result against a full copy."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = HiddenMatrices()
    reference = copy.deepcopy(model)
    fully_shard(model, mesh=mesh)
    optimizer = Muon.for_model(model, lr=0.02, exchange=exchange)
    ref_optimizer = Muon.for_model(reference, lr=0.02)
    ref_params = dict(reference.named_parameters())
    timer = StepTimer("cpu", warmup_steps=warmup)
    for step in range(warmup + steps):
        grads = _grads(reference, step)
        for name, param in model.named_parameters():
            param.grad = distribute_tensor(grads[name], mesh, [Shard(0)])
            ref_params[name].grad = grads[name]
        dist.barrier()  # every rank starts the step together: the time is the step's, not a straggler's wait
        timer.start()
        optimizer.step()
        timer.stop()
        ref_optimizer.step()
    errors = [rel_error(param.full_tensor(), ref_params[name].detach()) for name, param in model.named_parameters()]
    stats = optimizer.comm_stats
    return {
        "rank": dist.get_rank(),
        "step_s": timer.steady,
        "exchange_s_per_step": stats.exchange_s / stats.steps,
        "newton_schulz_s_per_step": stats.newton_schulz_s / stats.steps,
        "per_step": stats.last_step,
        "max_rel_error_vs_single_process": max(errors),
    }


def projected_bytes(world: int, shapes: list[tuple[int, int]]) -> dict:
    """Bytes per rank per step (sent + received) from the plan alone: the mean rank and the busiest."""
    owners = assign_owners(shapes, world)
    all_to_all, naive = [], []
    for rank in range(world):
        mine = [fsdp_rows(rows, world)[rank] * cols for rows, cols in shapes]
        sent = sum(n for n, owner in zip(mine, owners) if owner != rank)
        received = sum(rows * cols - n for (rows, cols), n, owner in zip(shapes, mine, owners) if owner == rank)
        all_to_all.append(2 * (sent + received) * WIRE_DTYPE.itemsize)  # exchange 2 mirrors exchange 1
        naive.append(sum(n * (world - 1) + (rows * cols - n) for (rows, cols), n in zip(shapes, mine)) * WIRE_DTYPE.itemsize)
    return {
        "world": world,
        "matrices": len(shapes),
        "all_to_all_mean_bytes": statistics.fmean(all_to_all),
        "all_to_all_busiest_bytes": max(all_to_all),
        "all_gather_mean_bytes": statistics.fmean(naive),
        "saving_mean": statistics.fmean(naive) / statistics.fmean(all_to_all),
        "saving_busiest": max(naive) / max(all_to_all),
    }


def summarise(world: int, exchange: str, ranks: list[dict]) -> dict:
    per_step = [r["per_step"] for r in ranks]
    # A step ends when its slowest rank ends: per step, the max over ranks; then the median over steps.
    step_times = [max(r["step_s"][i] for r in ranks) for i in range(len(ranks[0]["step_s"]))]
    return {
        "world": world,
        "exchange": exchange,
        "sent_bytes_per_rank": statistics.fmean(s["sent_bytes"] for s in per_step),
        "received_bytes_per_rank": statistics.fmean(s["received_bytes"] for s in per_step),
        "max_bytes_per_rank": max(s["sent_bytes"] + s["received_bytes"] for s in per_step),
        "naive_bytes_per_rank": statistics.fmean(s["naive_sent_bytes"] + s["naive_received_bytes"] for s in per_step),
        "newton_schulz_per_rank": [s["newton_schulz_matrices"] for s in per_step],
        "step_s": statistics.median(step_times),
        "best_step_s": min(step_times),
        "exchange_s": max(r["exchange_s_per_step"] for r in ranks),
        "newton_schulz_s": max(r["newton_schulz_s_per_step"] for r in ranks),
        "max_rel_error_vs_single_process": max(r["max_rel_error_vs_single_process"] for r in ranks),
        "ranks": ranks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    started = time.perf_counter()
    load_start = os.getloadavg()
    runs = []
    for world in [int(x) for x in args.world_sizes.split(",")]:
        for exchange in EXCHANGES:
            ranks = run_on_ranks(bench_rank, world_size=world, args=(exchange, 1, args.steps), timeout_s=600, threads_per_rank=1)
            runs.append(summarise(world, exchange, ranks))
            print(f"  {world} ranks {exchange:10s} step {runs[-1]['step_s'] * 1000:8.1f} ms", flush=True)
    result = {
        "config": {
            "shapes": SHAPES, "wire_dtype": str(WIRE_DTYPE), "steps": args.steps, "threads_per_rank": 1,
            "cpu_cores": os.cpu_count(), "torch": torch.__version__, "backend": "gloo",
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        },
        "runs": runs,
        "projected": [projected_bytes(world, SHAPES) for world in PROJECTED_WORLD_SIZES]
        + [projected_bytes(world, SHAPES * LAYERS_PROJECTED) for world in PROJECTED_WORLD_SIZES],
        "notes": [
            "bytes: per rank per step, to and from other ranks, counted by Muon.comm_stats; naive = all-gather of every matrix.",
            "all-to-all moves about 2/world of the naive bytes: equal at 2 ranks, half at 4; the saving grows with world size "
            "(projected) as long as each rank owns several matrices: with fewer matrices than ranks, the owner of the largest "
            "matrix receives nearly all of it and bounds the busiest rank's saving.",
            "exchange_s includes waiting in the second exchange for the owners' Newton-Schulz: it is not wire time alone.",
            f"{os.cpu_count()} CPU cores shared by all ranks (and other processes): at 4 ranks the step times include oversubscription.",
            "step_s: median over steady steps of the slowest rank's step time (best_step_s: the fastest such step).",
        ],
        "total_s": time.perf_counter() - started,
    }
    out = Path(args.out)
    atomic_write_json(out / "muon.json", result)
    mib = 1 / 2**20
    print_table(
        [
            {
                "ranks": r["world"],
                "exchange": r["exchange"],
                "MiB/rank/step": f"{r['max_bytes_per_rank'] * mib:.2f}",
                "naive MiB": f"{r['naive_bytes_per_rank'] * mib:.2f}",
                "NS matrices/rank": ",".join(map(str, r["newton_schulz_per_rank"])),
                "step ms": f"{r['step_s'] * 1000:.1f}",
                "best ms": f"{r['best_step_s'] * 1000:.1f}",
                "exchange ms": f"{r['exchange_s'] * 1000:.1f}",
                "NS ms": f"{r['newton_schulz_s'] * 1000:.1f}",
                "rel err": f"{r['max_rel_error_vs_single_process']:.1e}",
            }
            for r in runs
        ],
        ["ranks", "exchange", "MiB/rank/step", "naive MiB", "NS matrices/rank", "step ms", "best ms", "exchange ms", "NS ms", "rel err"],
        title="Distributed Muon, 8 x [512, 512] + [1024, 512] (gloo, CPU)",
    )
    print_table(
        [
            {
                "matrices": p["matrices"],
                "ranks": p["world"],
                "all-to-all MiB (mean)": f"{p['all_to_all_mean_bytes'] * mib:.2f}",
                "all-gather MiB (mean)": f"{p['all_gather_mean_bytes'] * mib:.2f}",
                "saving (mean rank)": f"{p['saving_mean']:.1f}x",
                "saving (busiest rank)": f"{p['saving_busiest']:.1f}x",
            }
            for p in result["projected"]
        ],
        ["matrices", "ranks", "all-to-all MiB (mean)", "all-gather MiB (mean)", "saving (mean rank)", "saving (busiest rank)"],
        title="Projected from the plan alone (no processes), per rank per step",
    )
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"wrote {out / 'muon.json'} in {result['total_s']:.0f} s")


if __name__ == "__main__":
    main()
