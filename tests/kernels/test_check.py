"""`assay kernels check` and `assay kernels bench`: what they compare, what they report, exit codes."""

from __future__ import annotations

import pytest

import json
import os
from dataclasses import replace

import torch

from assay.kernels.bench import bench_kernel
from assay.kernels.check import check_kernel, check_kernels
from assay.kernels.registry import get_kernel, register_kernel, unregister_kernel


def test_check_passes_every_kernel_in_float32_and_bfloat16_against_float64():
    report = check_kernels()
    assert report.ok, [row for row in report.failures]
    kernels = {row.kernel for row in report.rows}
    assert {"rope", "grouped_experts", "attention"} <= kernels
    assert {row.dtype for row in report.rows} == {"float32", "bfloat16"}
    for name in ("rope", "grouped_experts", "attention"):
        tensors = {row.tensor for row in report.rows if row.kernel == name}
        assert any(t.startswith("out ") for t in tensors) and any(t.startswith("grad ") for t in tensors)
        assert len({row.case for row in report.rows if row.kernel == name}) >= 3
    # Same arithmetic as the PyTorch reference in float32: the reference system's 0.0.
    worst = report.float32_max_abs_vs_torch()
    assert worst["rope"] == 0.0 and worst["attention"] == 0.0
    assert all(row.max_abs_vs_torch is None for row in report.rows if row.dtype == "bfloat16")
    assert all(row.ok for row in report.rows if row.tensor == "no grad cos, sin")


def test_check_reports_exact_zero_for_grouped_experts_on_aligned_top2_shapes():
    rows = check_kernel(get_kernel("grouped_experts"), torch.device("cpu"), dtypes=(torch.float32,))
    aligned_top2 = [row for row in rows if row.case == "N24 d64 h32 E8 k2" and row.max_abs_vs_torch is not None]
    assert aligned_top2 and all(row.max_abs_vs_torch == 0.0 for row in aligned_top2)


def _wrong_rope(q, k, cos, sin):
    from assay.kernels.rope import rope_bthd

    q_rot, k_rot = rope_bthd(q, k, cos, sin)
    return q_rot * 1.01, k_rot


def test_check_fails_a_kernel_that_is_off():
    broken = replace(get_kernel("rope"), name="rope_off_by_one_percent", function=_wrong_rope)
    register_kernel(broken)
    try:
        report = check_kernels(["rope_off_by_one_percent"], dtypes=(torch.float32,))
    finally:
        unregister_kernel("rope_off_by_one_percent")
    assert not report.ok
    assert {row.tensor for row in report.failures} == {"out q", "grad q"}
    failed = report.failures[0]
    assert failed.rel > failed.tol and failed.max_abs_vs_torch > 0


PLUGIN = """
from dataclasses import replace

from assay.kernels.registry import get_kernel, register_kernel
from assay.kernels.rope import rope_bthd


def _wrong_rope(q, k, cos, sin):
    q_rot, k_rot = rope_bthd(q, k, cos, sin)
    return q_rot, k_rot * 1.01


register_kernel(replace(get_kernel("rope"), name="rope_off", function=_wrong_rope))
"""


def test_cli_check_exits_1_when_a_kernel_fails(assay_cli, tmp_path):
    # A kernel registered from outside assay, by a plugin module (ASSAY_PLUGINS), is checked like the built-ins.
    (tmp_path / "off_kernel_plugin.py").write_text(PLUGIN)
    env = {"ASSAY_PLUGINS": "off_kernel_plugin", "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    result = assay_cli("kernels", "check", "--kernels", "rope_off", env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "FAIL" in result.stdout and "out k" in result.stdout


def test_cli_check_json_and_exit_code(assay_cli):
    result = assay_cli("kernels", "check", "--kernels", "rope,attention", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["ok"] and report["failed"] == 0 and report["checks"] == len(report["rows"])
    assert report["float32_max_abs_vs_torch"] == {"rope": 0.0, "attention": 0.0}


@pytest.mark.slow
def test_cli_check_table_and_unknown_kernel(assay_cli):
    result = assay_cli("kernels", "check", "--kernels", "rope")
    assert result.returncode == 0
    assert "float32 kernel vs PyTorch float32 reference, max abs diff: rope 0.0" in result.stdout
    assert "30 passed, 0 failed" in result.stdout
    unknown = assay_cli("kernels", "check", "--kernels", "nope")
    assert unknown.returncode == 2 and "unknown kernel 'nope'" in unknown.stderr


def test_bench_reports_medians_and_ratios_for_forward_and_backward():
    kernel = replace(get_kernel("grouped_experts"), bench_cases=get_kernel("grouped_experts").cases[:1])
    rows = bench_kernel(kernel, torch.device("cpu"), torch.float32, warmup=1, repeats=3)
    assert [row.mode for row in rows] == ["fwd", "fwd+bwd"]
    for row in rows:
        assert row.kernel_ms > 0 and row.reference_ms > 0 and row.repeats == 3
        assert abs(row.speedup - row.reference_ms / row.kernel_ms) < 1e-9
        assert row.impl == "grouped_mm"


@pytest.mark.slow
def test_cli_bench_writes_json(assay_cli, tmp_path):
    out = tmp_path / "kernels.json"
    result = assay_cli("kernels", "bench", "--kernels", "rope", "--repeats", "1", "--warmup", "0", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    assert written == json.loads(result.stdout)
    assert {row["mode"] for row in written["rows"]} == {"fwd", "fwd+bwd"} and written["device"] == "cpu"
