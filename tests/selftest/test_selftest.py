"""The device check (`scripts/device_check.sh` -> `assay selftest`) on the CPU: every part runs as the
real command, is recorded with a status, and a part that fails or is killed does not stop the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers.cli import REPO

from assay.selftest import SelftestRequest, plan, run_selftest
from assay.selftest.runner import MIN_PART_S

STATUSES = {"PASSED", "FAILED", "TIMEOUT", "NOT_RUN"}
QUICK_PARTS = ["stack", "zoo", "probe-qwen3", "kernels", "train", "gla", "serve"]


def device_check(*args: str, timeout: float = 800) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "device_check.sh"), "--python", sys.executable, *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick CPU run through the script, the GLA part given a limit it cannot meet (0.5 s: its
    interpreter alone takes longer to start). A budget above the quick default: a loaded CI machine took
    200 s for this run, and a part cut by the budget would fail the test for the wrong reason."""
    out = tmp_path_factory.mktemp("selftest")
    completed = device_check("--device", "cpu", "--quick", "--out", str(out), "--timeouts", "gla=0.5", "--budget", "700")
    summary = json.loads((out / "selftest.json").read_text())
    return completed, summary, out


@pytest.mark.slow
def test_every_part_is_recorded_with_a_status(quick_run):
    _, summary, _ = quick_run
    parts = {part["name"]: part for part in summary["parts"]}
    assert list(parts) == QUICK_PARTS
    for part in parts.values():
        assert part["status"] in STATUSES and part["seconds"] is not None and part["timeout_s"] > 0, part
    assert summary["device"] == "cpu" and summary["quick"] and summary["backend"] == "aot_eager"
    assert len(summary["load_average_start"]) == 3 and summary["wall_s"] > 0


def test_a_part_killed_at_its_limit_is_timeout_and_the_rest_still_run(quick_run):
    completed, summary, _ = quick_run
    parts = {part["name"]: part for part in summary["parts"]}
    assert parts["gla"]["status"] == "TIMEOUT" and "killed after 0.5 s" in parts["gla"]["error"]
    assert parts["gla"]["seconds"] < 10  # killed, not waited for
    passed = [name for name, part in parts.items() if part["status"] == "PASSED"]
    assert passed == [name for name in QUICK_PARTS if name != "gla"], [(p["name"], p["status"], p["error"]) for p in parts.values()]
    assert completed.returncode == 1 and not summary["ok"] and summary["counts"] == {"PASSED": 6, "TIMEOUT": 1}
    assert "TIMEOUT" in completed.stdout and "selftest.json" in completed.stdout  # the table


def test_parts_write_the_usual_result_files(quick_run):
    _, summary, out = quick_run
    parts = {part["name"]: part for part in summary["parts"]}
    assert list((out / "results").glob("*.parquet")), "the probe records its row in the dataset"
    assert parts["probe-qwen3"]["result"]["status"] == "PASS"
    metrics = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["loss"] > 0 for m in metrics)
    train = parts["train"]["result"]
    assert train["dtype"] == "bfloat16" and train["steps_run"] == 3 and train["steady_tokens_per_s"] > 0
    assert any("KernelRotaryEmbedding" in line for line in train["kernels"])
    kernels = parts["kernels"]["result"]
    assert kernels["dtypes"] == ["bfloat16", "float32"] and kernels["failed"] == 0 and kernels["checks"] > 0
    serve = parts["serve"]["result"]
    assert serve["requests_finished"] == serve["requests_sent"] and serve["mode"] == "buckets" and serve["tokens_per_s"] > 0
    assert (out / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in QUICK_PARTS:
        assert (out / parts[name]["log"]).exists()


@pytest.mark.slow
def test_a_failed_prerequisite_leaves_its_dependants_not_run(tmp_path):
    (tmp_path / "zoo-file").write_text("not a folder")
    out = tmp_path / "out"
    request = SelftestRequest(out=out, quick=True, parts=("zoo", "probe", "gla"), zoo=tmp_path / "zoo-file", progress=False)
    summary = run_selftest(request).as_dict()
    assert json.loads((out / "selftest.json").read_text())["parts"] == json.loads(json.dumps(summary["parts"]))
    parts = {part["name"]: part for part in summary["parts"]}
    assert parts["zoo"]["status"] == "FAILED" and "is not a folder" in parts["zoo"]["error"] and parts["zoo"]["returncode"] == 2
    assert parts["probe-qwen3"]["status"] == "NOT_RUN" and "needs zoo" in parts["probe-qwen3"]["error"]
    assert parts["gla"]["status"] == "PASSED" and parts["gla"]["result"]["ok"]
    assert not summary["ok"]


def test_a_part_is_not_started_past_the_run_budget(tmp_path):
    result = run_selftest(SelftestRequest(out=tmp_path, quick=True, parts=("gla",), budget_s=MIN_PART_S - 1, progress=False))
    assert result.parts[0].status == "NOT_RUN" and "budget" in result.parts[0].error and not result.ok
    assert not (tmp_path / "gla.json").exists()  # never started


def _processes_with(marker: str) -> list[int]:
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                pids.append(int(environ.parent.name))
        except OSError:  # gone, or not ours
            pass
    return pids


@pytest.mark.slow
def test_sigterm_kills_the_running_part_and_records_it(tmp_path):
    """A job runner's time limit (SIGTERM) must not leave a part running on the device."""
    marker = f"ASSAY_SELFTEST_MARKER_{uuid.uuid4().hex}"
    parent = subprocess.Popen([sys.executable, "-m", "assay", "selftest", "--quick", "--out", str(tmp_path), "--parts", "gla"],
                              env=os.environ | {marker: "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_processes_with(marker)) < 2 and time.monotonic() < deadline:  # the selftest and its gla part
        time.sleep(0.2)
    assert len(_processes_with(marker)) >= 2
    parent.send_signal(signal.SIGTERM)
    parent.communicate(timeout=30)
    assert parent.returncode == 130  # Typer's exit code for an interrupt
    time.sleep(0.5)
    assert _processes_with(marker) == []
    gla = json.loads((tmp_path / "selftest.json").read_text())["parts"][0]
    assert gla["status"] == "FAILED" and gla["error"] == "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--device", "cuda"], "device 'cuda' is not available"),
        (["--timeouts", "gla=soon"], "is not PART=SECONDS"),
        (["--parts", "kernels,warp"], "unknown part 'warp'"),
        (["--models", "qwen9"], "'qwen9' is not a zoo entry"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(assay_cli, tmp_path, args, fragment):
    result = assay_cli("selftest", "--quick", "--out", str(tmp_path / "out"), *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and fragment in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_full_plan_is_the_issue_s_check(tmp_path):
    """What a GPU run would start (nothing runs here): inductor probes of three models, real Triton,
    20 bf16 steps of a 0.6B-shaped model with kernels, GLA at 4K and 16K, serving 64 sequences."""
    parts = {part.name: part for part in plan(SelftestRequest(out=tmp_path, device="cuda"))}
    assert list(parts) == ["stack", "zoo", "probe-qwen3", "probe-gpt2", "probe-mixtral", "kernels", "train", "gla", "serve"]
    argv = {name: " ".join(part.argv) for name, part in parts.items()}
    assert "--device cuda --backend inductor" in argv["probe-gpt2"]
    assert "kernels check --device cuda --impl triton --json" in argv["kernels"]
    for flag in ("--kernels rope,attention", "--dtype bfloat16", "--steps 20", "--flavour 0.6B"):
        assert flag in argv["train"]
    assert "--lengths 4096,16384" in argv["gla"]
    assert "--concurrency 64" in argv["serve"] and "--buckets 1,2,4,8,16,32,64" in argv["serve"] and "--modes buckets" in argv["serve"]
    assert SelftestRequest(out=tmp_path, device="cuda").total_budget_s <= 8 * 60
    assert [part.name for part in plan(SelftestRequest(out=tmp_path, parts=("train", "kernels")))] == ["zoo", "kernels", "train"]
    grouped = plan(SelftestRequest(out=tmp_path, device="cuda", timeouts={"probe": 7, "probe-gpt2": 9}))
    assert {part.name: part.timeout_s for part in grouped if part.name.startswith("probe")} == {
        "probe-qwen3": 7, "probe-gpt2": 9, "probe-mixtral": 7}
