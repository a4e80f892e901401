"""`--executor ray` against a local Ray instance the test starts (and stops)."""

import json
import os
import subprocess
import sys

import pytest

from assay.compat.results.dataset import query


@pytest.mark.distributed  # a Ray cluster and its worker processes
def test_ray_sweep_records_every_model_once(zoo_dir, tmp_path):
    # `ray start --head` is a real local cluster; the sweep joins it through RAY_ADDRESS.
    env = os.environ.copy() | {"RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    start = subprocess.run([ray_bin, "start", "--head", "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats"],
                           capture_output=True, text=True, env=env, timeout=180)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        sweep = subprocess.run(
            [sys.executable, "-m", "assay", "sweep", str(zoo_dir / "llama"), str(zoo_dir / "gpt2"), "--executor", "ray",
             "--backend", "eager", "--new-tokens", "4", "--out", str(tmp_path), "--json"],
            capture_output=True, text=True, env=env | {"RAY_ADDRESS": "auto"}, timeout=600,
        )
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        assert json.loads(sweep.stdout)["counts"] == {"PASS": 2}
        assert sorted(r["model"] for r in query(tmp_path)) == ["assay-zoo/gpt2", "assay-zoo/llama"]
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env, timeout=120)
