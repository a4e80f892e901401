"""Kernels vs their references on this machine: `python bench/train/kernels.py` -> bench/results/kernels.json.

The same run as `assay kernels bench` (assay.kernels.bench): per registered kernel and benchmark shape,
forward and forward+backward wall time of the kernel and of the plain-PyTorch reference, the median
of several runs after warm-up, and the speed-up ratio reference / kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse

import torch

from assay.core.output import print_table
from assay.kernels.bench import bench_kernels
from assay.kernels.commands import BENCH_COLUMNS
from bench.common import RESULTS



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "kernels.json")
    options = parser.parse_args()
    names = options.kernels.split(",") if options.kernels else None
    report = bench_kernels(
        names, device=options.device, dtype=getattr(torch, options.dtype), warmup=options.warmup, repeats=options.repeats, out=options.out
    )
    print_table([row.__dict__ for row in report.rows], BENCH_COLUMNS, title=f"kernels bench on {report.device_name}")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
