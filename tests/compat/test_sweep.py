"""Sweeps: isolation against real misbehaving processes, resume after SIGKILL, shards, merging."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from assay.compat.results.dataset import query
from assay.compat.run.models_list import shard_models
from assay.compat.run.placement import DevicePool

TESTS = str(Path(__file__).resolve().parents[1])
PLUGIN_ENV = {"ASSAY_PLUGINS": "helpers.misbehaving_backends", "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _sweep(assay_cli, *args, env=None):
    return assay_cli("sweep", *args, "--json", env=env, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, timeout, limit, status, reason",
    [
        ("test_hang", "5", None, "TIMEOUT", "5 s time limit"),
        ("test_segfault", "120", None, "CRASH", "SIGSEGV"),
        ("test_memory_hog", "120", "3", "OOM", ""),
        ("test_compiler_crash", "120", None, "FAIL_COMPILE", "unsupported operator"),
    ],
)
def test_misbehaving_probe_is_recorded_and_the_sweep_goes_on(zoo_dir, tmp_path, assay_cli, backend, timeout, limit, status, reason):
    args = [str(zoo_dir / "qwen3"), str(zoo_dir / "gpt2"), "--backend", backend, "--timeout", timeout, "--out", str(tmp_path)]
    if limit:
        args += ["--memory-limit-gb", limit]
    result = _sweep(assay_cli, *args, env=PLUGIN_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = query(tmp_path)
    assert sorted(r["model"] for r in rows) == ["assay-zoo/gpt2", "assay-zoo/qwen3"]  # both recorded
    for row in rows:
        assert row["status"] == status, (row["reason"], (row["error"] or "")[-500:])
        assert reason in (row["reason"] or "") + (row["error"] or "")
        assert row["run_py"] and row["stack_id"]


@pytest.mark.slow
def test_rerun_skips_recorded_models_and_force_redoes_them(zoo_dir, tmp_path, assay_cli):
    args = [str(zoo_dir / "llama"), str(zoo_dir / "gpt2"), "--backend", "eager", "--new-tokens", "4", "--out", str(tmp_path)]
    first = json.loads(_sweep(assay_cli, *args).stdout)
    assert first["counts"] == {"PASS": 2}
    again = json.loads(_sweep(assay_cli, *args).stdout)
    assert again["rows"] == [] and sorted(again["skipped_existing"]) == ["assay-zoo/gpt2", "assay-zoo/llama"]
    forced = json.loads(_sweep(assay_cli, *args, "--force").stdout)
    assert len(forced["rows"]) == 2
    assert len(query(tmp_path)) == 2


@pytest.mark.slow
def test_sigkill_mid_sweep_then_rerun_loses_and_duplicates_nothing(zoo_dir, tmp_path, assay_cli):
    models = [str(zoo_dir / name) for name in ("llama", "gpt2", "qwen2", "opt")]
    command = [sys.executable, "-m", "assay", "sweep", *models, "--backend", "eager", "--new-tokens", "4", "--out", str(tmp_path), "--json"]
    sweep = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        parquet = list(tmp_path.glob("*.parquet"))
        if parquet and len(query(tmp_path)) >= 1:
            break
        time.sleep(0.2)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    recorded_before = {r["model"] for r in query(tmp_path)}
    assert 1 <= len(recorded_before) < 4
    time.sleep(1)  # the killed sweep's probe process dies with it (PR_SET_PDEATHSIG)
    rerun = assay_cli(*command[3:], timeout=600)  # the killed sweep was a real process; its rerun need not be
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    report = json.loads(rerun.stdout)
    assert set(report["skipped_existing"]) == recorded_before
    rows = query(tmp_path)
    assert sorted(r["model"] for r in rows) == sorted(f"assay-zoo/{n}" for n in ("llama", "gpt2", "qwen2", "opt"))
    assert not list(tmp_path.glob(".*.tmp"))


def test_shards_partition_the_list_whatever_its_order():
    models = [f"org/model-{i}" for i in range(50)]
    shards = [shard_models(models, (i, 4)) for i in range(1, 5)]
    assert sorted(m for s in shards for m in s) == sorted(models)
    assert all(s for s in shards)
    assert shard_models(list(reversed(models)), (2, 4)) == list(reversed(shards[1]))


@pytest.mark.slow
def test_results_of_two_machines_merge_without_duplicates(zoo_dir, tmp_path, assay_cli):
    models = ["llama", "gpt2", "qwen2"]
    listing = tmp_path / "models.txt"
    listing.write_text("# three models\n" + "\n".join(str(zoo_dir / m) for m in models) + "\n")
    for i in (1, 2):
        result = _sweep(assay_cli, "--list", str(listing), "--shard", f"{i}/2", "--backend", "eager", "--new-tokens", "4", "--out", str(tmp_path / f"m{i}"))
        assert result.returncode == 0, result.stderr
    merged = assay_cli("merge", str(tmp_path / "all"), str(tmp_path / "m1"), str(tmp_path / "m2"), str(tmp_path / "m1"), "--json")
    assert merged.returncode == 0, merged.stderr
    rows = query(tmp_path / "all")
    assert sorted(r["model"] for r in rows) == sorted(f"assay-zoo/{m}" for m in models)


def test_a_probe_needing_two_devices_waits_for_two_free():
    pool = DevicePool(2)
    held = pool.acquire(1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(2)))
    waiter.start()
    time.sleep(0.3)
    assert got == []  # one device is busy: the two-device probe must wait
    pool.release(held)
    waiter.join(timeout=5)
    assert got == [[0, 1]]
