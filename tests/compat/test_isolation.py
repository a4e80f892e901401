"""A probe in its own process: real misbehaving processes (hang, segfault, memory hog), no mocks."""

import json
import sys

import torch

from assay.compat.isolate import run_isolated
from assay.compat.probe import ProbeRequest, classify_exception, plan_probe

HANG = "import time\nwhile True:\n    time.sleep(1)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
MEMORY_HOG = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 2**20))\n"
RAISES = "raise ValueError('the model code raised outside any phase')\n"


def _script(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def _plan(zoo_dir):
    return plan_probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="eager"))


def test_hang_is_killed_and_recorded_timeout(zoo_dir, tmp_path):
    row = run_isolated(_plan(zoo_dir), timeout=2, command=_script(tmp_path, "hang", HANG))
    assert row["status"] == "TIMEOUT" and "2 s" in row["reason"]
    assert row["model"] == "assay-zoo/qwen3" and row["run_py"] and row["stack_id"]  # the row is still whole
    assert 2 <= row["total_s"] < 30


def test_segfault_is_recorded_crash_with_the_signal(zoo_dir, tmp_path):
    row = run_isolated(_plan(zoo_dir), timeout=60, command=_script(tmp_path, "segv", SEGFAULT))
    assert row["status"] == "CRASH" and "SIGSEGV" in row["reason"]


def test_memory_hog_under_a_limit_is_recorded_oom(zoo_dir, tmp_path):
    row = run_isolated(_plan(zoo_dir), timeout=60, memory_limit_bytes=512 * 2**20, command=_script(tmp_path, "hog", MEMORY_HOG))
    assert row["status"] == "OOM", row["reason"]


def test_exception_outside_the_probe_is_crash_with_its_message(zoo_dir, tmp_path):
    row = run_isolated(_plan(zoo_dir), timeout=60, command=_script(tmp_path, "raises", RAISES))
    assert row["status"] == "CRASH" and "outside any phase" in row["reason"]


def test_real_allocation_failure_classifies_as_oom():
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as exc:
        assert classify_exception(exc, "run") == "OOM"
    else:
        raise AssertionError("a 1 PiB allocation succeeded")


def test_isolated_probe_through_the_cli_passes(zoo_dir, tmp_path, assay_cli):
    result = assay_cli("probe", str(zoo_dir / "gpt2"), "--backend", "aot_eager", "--new-tokens", "6", "--timeout", "300", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "PASS"
