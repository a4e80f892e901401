"""A probe in its own process: real misbehaving processes (hang, segfault, memory hog), no mocks."""

import json
import os
from pathlib import Path

import pytest
import torch

import helpers.misbehaving_backends  # noqa: F401  (registers the test_* compile backends in this process too)
from assay.compat.isolate import run_isolated
from assay.compat.probe import ProbeRequest, classify_exception, plan_probe

TESTS = str(Path(__file__).resolve().parents[1])


def _env(plugin: str = "helpers.misbehaving_backends") -> dict:
    # The child is a real probe worker; the misbehaviour comes from a compiler it loads as a plugin.
    return {"ASSAY_PLUGINS": plugin, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _plan(zoo_dir, backend="eager"):
    return plan_probe(ProbeRequest(str(zoo_dir / "qwen3"), backend=backend, new_tokens=2))


@pytest.mark.slow
def test_hang_is_killed_and_recorded_timeout(zoo_dir):
    row = run_isolated(_plan(zoo_dir, "test_hang"), timeout=20, env=_env())
    assert row["status"] == "TIMEOUT" and "20 s" in row["reason"]
    assert row["model"] == "assay-zoo/qwen3" and row["run_py"] and row["stack_id"]  # the row is still whole
    assert 20 <= row["total_s"] < 60


@pytest.mark.slow
def test_segfault_is_recorded_crash_with_the_signal(zoo_dir):
    row = run_isolated(_plan(zoo_dir, "test_segfault"), timeout=120, env=_env())
    assert row["status"] == "CRASH" and "SIGSEGV" in row["reason"]


@pytest.mark.slow
def test_memory_hog_under_a_limit_is_recorded_oom(zoo_dir):
    # 3 GiB of address space: torch, transformers and the model fit; the compiler's hoard does not.
    row = run_isolated(_plan(zoo_dir, "test_memory_hog"), timeout=120, memory_limit_bytes=3 * 2**30, env=_env())
    assert row["status"] == "OOM", row["reason"]


def test_exception_outside_the_probe_is_crash_with_its_message(zoo_dir):
    row = run_isolated(_plan(zoo_dir), timeout=120, env=_env("helpers.raising_plugin"))
    assert row["status"] == "CRASH" and "outside any phase" in row["reason"]


def test_real_allocation_failure_classifies_as_oom():
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as exc:
        assert classify_exception(exc, "run") == "OOM"
    else:
        raise AssertionError("a 1 PiB allocation succeeded")


@pytest.mark.slow
def test_isolated_probe_through_the_cli_passes(zoo_dir, tmp_path, assay_cli):
    result = assay_cli("probe", str(zoo_dir / "gpt2"), "--backend", "aot_eager", "--new-tokens", "6", "--timeout", "300", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "PASS"
