"""The sweep's zygote: one pre-imported process forks each probe; every child is still isolated."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from assay.compat.run.zygote import Zygote

TESTS = str(Path(__file__).resolve().parents[1])
MODULE = "helpers.zygote_children"


@pytest.fixture(scope="module")
def zygote():
    with Zygote(env={"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}) as handle:
        handle.wait_ready()
        yield handle


def _run(zygote, tmp_path, behaviour, timeout=120, env=None, memory_limit=None):
    out, stderr = tmp_path / f"{behaviour}.json", tmp_path / f"{behaviour}.stderr"
    pid = zygote.spawn(MODULE, [behaviour, str(out)], stderr, env=env, memory_limit_bytes=memory_limit)
    returncode, timed_out = zygote.wait(pid, timeout)
    return pid, returncode, timed_out, out, stderr.read_text() if stderr.exists() else ""


@pytest.mark.slow
def test_child_is_its_own_session_with_its_env_threads_and_no_import_cost(zygote, tmp_path):
    pid, returncode, timed_out, out, stderr = _run(zygote, tmp_path, "describe", env={"OMP_NUM_THREADS": "1", "ASSAY_TEST_MARKER": "m1"})
    assert (returncode, timed_out) == (0, False)
    facts = json.loads(out.read_text())
    assert facts["pid"] == pid and facts["pgid"] == pid and facts["sid"] == pid  # killpg(pid) reaches all it starts
    assert facts["ppid"] != os.getpid()  # forked by the zygote, not started by us
    assert facts["torch_threads"] == 1 and facts["marker"] == "m1"  # the per-probe env applies after the fork
    assert facts["import_s"] < 0.5  # transformers came with the zygote (a fresh import takes seconds here)
    assert facts["stdout_is_devnull"] and "to stderr" in stderr


def test_two_children_get_their_own_env(zygote, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _run(zygote, tmp_path / name, "describe", env={"ASSAY_TEST_MARKER": name})
    assert json.loads((tmp_path / "a" / "describe.json").read_text())["marker"] == "a"
    assert json.loads((tmp_path / "b" / "describe.json").read_text())["marker"] == "b"


def test_segfault_is_reported_as_the_signal(zygote, tmp_path):
    _, returncode, timed_out, _, _ = _run(zygote, tmp_path, "segfault")
    assert returncode == -signal.SIGSEGV and not timed_out


@pytest.mark.slow
def test_hang_is_killed_at_the_timeout_with_its_group(zygote, tmp_path):
    started = time.monotonic()
    pid, returncode, timed_out, _, _ = _run(zygote, tmp_path, "hang", timeout=3)
    assert timed_out and returncode == -signal.SIGKILL
    assert 3 <= time.monotonic() - started < 30
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing of its process group is left


def test_memory_limit_turns_a_hog_into_memory_error(zygote, tmp_path):
    _, returncode, _, _, stderr = _run(zygote, tmp_path, "hog", memory_limit=3 * 2**30)
    assert returncode == 1 and "MemoryError" in stderr


def test_exception_and_exit_code_come_back(zygote, tmp_path):
    _, returncode, _, _, stderr = _run(zygote, tmp_path, "raise")
    assert returncode == 1 and "raised in the forked child" in stderr
    _, returncode, _, _, _ = _run(zygote, tmp_path, "exit3")
    assert returncode == 3


@pytest.mark.slow
def test_closing_the_zygote_kills_its_running_children(tmp_path):
    handle = Zygote(env={"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")})
    pid = handle.spawn(MODULE, ["hang", str(tmp_path / "pid")], tmp_path / "stderr")
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.close()
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


@pytest.mark.slow
def test_sweep_with_fresh_interpreters_records_the_same_rows(zoo_dir, tmp_path, assay_cli):
    args = [str(zoo_dir / "gpt2"), "--backend", "eager", "--new-tokens", "4", "--json"]
    forked = json.loads(assay_cli("sweep", *args, "--out", str(tmp_path / "forked")).stdout)
    fresh = json.loads(assay_cli("sweep", *args, "--fresh-interpreter", "--out", str(tmp_path / "fresh")).stdout)
    assert forked["counts"] == fresh["counts"] == {"PASS": 1}
    assert forked["rows"][0]["generated_tokens"] == fresh["rows"][0]["generated_tokens"]
