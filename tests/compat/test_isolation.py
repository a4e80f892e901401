"""A probe in its own process: real misbehaving processes (hang, segfault, memory hog), no mocks."""

import json
import os
from pathlib import Path

import pytest
import torch

from assay.compat.run.isolate import run_isolated
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.request import ProbeRequest, classify_exception

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


def test_the_plan_crosses_as_json_and_comes_back_equal(zoo_dir):
    from assay.compat.probe.request import ProbePlan

    plan = plan_probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="eager", new_tokens=2, eval_tasks=("assay_cloze",)))
    text = plan.to_json()
    assert json.loads(text)["request"]["model"] == str(zoo_dir / "qwen3")  # plain JSON, no pickle
    again = ProbePlan.from_json(text)
    assert again == plan and again.request.eval_tasks == ("assay_cloze",) and again.device == torch.device("cpu")


# The child's whole run under an audit hook: a class looked up by an unpickler ("pickle.find_class") is recorded.
_NO_PICKLE = """
import json, sys
found = []
sys.addaudithook(lambda event, args: found.append(f"{args[0]}.{args[1]}") if event == "pickle.find_class" else None)
from assay.compat.run.worker import main
main(sys.argv[1:3])
json.dump(found, open(sys.argv[3], "w"))
"""


@pytest.mark.slow
def test_the_child_runs_the_parents_plan_and_unpickles_nothing(zoo_dir, tmp_path):
    import subprocess
    import sys

    plan = _plan(zoo_dir)
    # A mark only the parent's plan carries: a child that planned again would write its own host name.
    plan.row["host"] = "planned-by-the-parent"
    (tmp_path / "plan.json").write_text(plan.to_json())
    completed = subprocess.run([sys.executable, "-c", _NO_PICKLE, str(tmp_path / "plan.json"), str(tmp_path / "row.json"), str(tmp_path / "found.json")],
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    row = json.loads((tmp_path / "row.json").read_text())
    assert row["status"] == "PASS" and row["host"] == "planned-by-the-parent"
    assert json.loads((tmp_path / "found.json").read_text()) == []


@pytest.mark.slow
def test_run_isolated_returns_the_row_of_the_plan_it_was_given(zoo_dir):
    plan = _plan(zoo_dir)
    plan.row["host"] = "planned-by-the-parent"
    row = run_isolated(plan, timeout=600)
    assert row["status"] == "PASS" and row["host"] == "planned-by-the-parent" and row["model"] == "assay-zoo/qwen3"
