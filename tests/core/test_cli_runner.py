"""The tests' CLI runner (tests/helpers/cli.py): a run forked from the pre-imported zygote is what a user sees
from a real `python -m assay` process: the same exit code, stdout and stderr, in the caller's working folder
and environment, and a timeout that kills it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from helpers.cli import run_assay, run_assay_process

# A plugin module (ASSAY_PLUGINS, found through PYTHONPATH): the command loads it first thing. It says where
# it runs and what it was given, leaves its pid in the working folder, then sleeps as long as it is told.
PLUGIN = """import os, time
print("plugin loaded in", os.getcwd(), os.environ["MARKER"], flush=True)
open("pid", "w").write(str(os.getpid()))
time.sleep(float(os.environ["SLEEP"]))
"""


def _plugin(tmp_path, sleep: float) -> tuple[object, dict]:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "where_plugin.py").write_text(PLUGIN)
    (tmp_path / "work").mkdir()
    return tmp_path / "work", {"ASSAY_PLUGINS": "where_plugin", "PYTHONPATH": str(tmp_path / "lib"), "MARKER": "m-1", "SLEEP": str(sleep)}


def _both(*args: str, **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return run_assay(*args, **kwargs), run_assay_process(*args, **kwargs)


@pytest.mark.parametrize("args", [["--help"], ["probe", "./no/such/model"], ["no-such-command"]], ids=" ".join)
def test_a_forked_run_answers_as_a_real_process(tmp_path, args):
    forked, real = _both(*args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.args == real.args


def test_a_forked_run_has_the_callers_folder_path_and_environment(tmp_path):
    work, env = _plugin(tmp_path, sleep=0)
    forked, real = _both("probe", "./no/such/model", cwd=work, env=env)
    assert forked.stdout == real.stdout == f"plugin loaded in {work} m-1\n"
    assert (forked.returncode, forked.stderr) == (real.returncode, real.stderr) and forked.returncode == 2


# The real process is the runner's fallback (a call that changes what the zygote read at import, or a zygote
# that has started threads): a timed-out run answers the same way through either.
@pytest.mark.parametrize("runner", [run_assay, run_assay_process], ids=["forked", "process"])
def test_a_run_past_its_timeout_is_killed(tmp_path, runner):
    work, env = _plugin(tmp_path, sleep=300)
    runner("--help")  # the zygote is ready, the imports are in the page cache: the timeout below times the run alone
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        runner("--help", cwd=work, env=env, timeout=5)
    assert time.monotonic() - started < 30
    assert "plugin loaded in" in raised.value.output  # what it wrote before the kill comes back, as text
    pid = int((work / "pid").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:  # killed, then reaped by the zygote
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the timed-out run is still there"
