"""The Triton implementations (the CUDA path), run on CPU tensors by Triton's interpreter.

TRITON_INTERPRET is read when a kernel is decorated, so each test starts a fresh Python with it set.
The kernels run through the same custom operators, wrappers and autograd as on a GPU; only the
implementation choice is forced (ASSAY_KERNEL_IMPL / use_impl). Shapes are small: the interpreter
executes every program of the grid in NumPy.
"""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
from dataclasses import replace
import torch
from assay.kernels.check import check_kernel
from assay.kernels.registry import get_kernel, use_impl

# Per kernel, the shapes that exercise the masks: several tiles with a ragged last one, grouped-query
# heads, odd head_dim / widths, top-4 routing over 16 experts.
CASES = {"rope": [0, 2], "attention": [0, 2], "grouped_experts": [1, 2]}
rows = []
for name, picks in CASES.items():
    kernel = get_kernel(name)
    kernel = replace(kernel, cases=tuple(kernel.cases[i] for i in picks))
    with use_impl("triton"):
        rows += [row.__dict__ for row in check_kernel(kernel, torch.device("cpu"))]
json.dump(rows, sys.stdout)
"""


def _interpreted(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = os.environ | {"TRITON_INTERPRET": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_triton_kernels_match_float64_references_forward_and_backward():
    result = _interpreted([sys.executable, "-c", SCRIPT])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout)
    assert {row["impl"] for row in rows} == {"triton"}
    assert {row["kernel"] for row in rows} == {"rope", "attention", "grouped_experts"}
    failures = [row for row in rows if not row["ok"]]
    assert not failures, failures
    # The rotary kernel does the reference's float32 arithmetic (no fused multiply-add): bit-equal.
    assert all(row["max_abs_vs_torch"] == 0.0 for row in rows if row["kernel"] == "rope" and row["dtype"] == "float32" and row["tensor"] != "no grad cos, sin")
    # bfloat16 outputs are rounded to nearest even (not truncated): no worse than the PyTorch reference.
    for row in rows:
        if row["dtype"] == "bfloat16" and not row["tensor"].startswith("no grad"):
            assert row["rel"] <= row["reference_rel"] * 1.25, row


@pytest.mark.slow
def test_cli_check_with_triton_forced_on_cpu_runs_the_interpreter():
    # The command sets TRITON_INTERPRET=1 itself for --impl triton on cpu.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "assay", "kernels", "check", "--kernels", "rope", "--impl", "triton", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] and report["forced_impl"] == "triton"
    assert {row["impl"] for row in report["rows"]} == {"triton"}
