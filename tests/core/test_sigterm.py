"""SIGTERM ends a long command with one line (`assay: terminated (SIGTERM)`) and exit 143, after its
cleanup ran: no process it started outlives it (a sweep's zygote and probes), no staging folder is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay.core.cli import TERMINATED_EXIT, TERMINATED_LINE

REPO = Path(__file__).resolve().parents[2]


def start(*args: str) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "assay", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO, start_new_session=True)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, grandchildren, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            living.add(pid)
    return living


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def terminate(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError("SIGTERM did not end the command") from None
    return process.returncode, stderr


@pytest.mark.slow
def test_sigterm_ends_training_with_one_line_and_exit_143(zoo_dir, tmp_path):
    metrics = tmp_path / "run.jsonl"
    process = start("train", "--model", str(zoo_dir / "qwen3"), "--steps", "100000", "--seq-len", "32", "--batch", "2",
                    "--metrics", str(metrics), "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1", "--json")
    try:
        wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, 180, "two training steps")
    finally:
        code, stderr = terminate(process)
    assert code == TERMINATED_EXIT
    assert [line for line in stderr.splitlines() if line.strip()] == [TERMINATED_LINE]
    assert not [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]  # no staging folder left


@pytest.mark.slow
def test_sigterm_ends_a_sweep_and_every_process_it_started(zoo_dir, tmp_path):
    process = start("sweep", "--zoo", str(zoo_dir), "--out", str(tmp_path / "results"), "--backend", "eager", "--workers", "1", "--json")
    try:
        # The sweep's zygote and a probe it forked (or a probe and what it started).
        wait_for(lambda: len(descendants(process.pid)) >= 2, 180, "a probe process")
        started = descendants(process.pid)
    finally:
        code, stderr = terminate(process)
    assert code == TERMINATED_EXIT, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == TERMINATED_LINE and "Traceback" not in stderr
    wait_for(lambda: not alive(started), 30, f"the sweep's processes {sorted(alive(started))} to end")


def test_a_forked_child_keeps_the_default_sigterm():
    """The handler belongs to the CLI's own process: a child forked from it dies of SIGTERM as usual."""
    script = (
        "import os, signal, sys, time\n"
        "from assay.core.cli import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "os.kill(pid, signal.SIGTERM)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                               env=os.environ | {"PYTHONPATH": str(REPO)})
    assert completed.stdout.strip() == str(int(signal.SIGTERM)), completed.stderr


# SIGTERM inside DCP's save: the patched writer signals this process as it starts writing checkpoint 2's
# shards, so the handler's Terminated is raised inside dcp.save, which wraps every failure in a
# CheckpointException (a traceback and exit 1 before checkpoint.py unwrapped it).
_SIGTERM_IN_DCP_SAVE = """
import os, signal, sys
import torch.distributed.checkpoint.filesystem as fs

write_data = fs.FileSystemWriter.write_data
def signalling_write_data(self, plan, planner):
    if str(self.path).endswith(".step-000002.tmp"):
        os.kill(os.getpid(), signal.SIGTERM)
    return write_data(self, plan, planner)
fs.FileSystemWriter.write_data = signalling_write_data
sys.argv = ["assay", *sys.argv[1:]]
from assay.cli import main
main()
"""


@pytest.mark.slow
def test_sigterm_inside_a_checkpoint_write_ends_with_one_line_and_keeps_the_previous_checkpoint(zoo_dir, tmp_path, monkeypatch):
    import torch
    import torch.distributed.checkpoint.filesystem as fs

    from assay.train import OptimConfig
    from assay.train.checkpoint import complete_checkpoints, incomplete_checkpoints, load_checkpoint
    from assay.train.distributed import Layout
    from assay.train.model_paths import ModelChoice, load_model
    from assay.train.optimization import build_optimizer

    folder = tmp_path / "ckpt"
    completed = subprocess.run(
        [sys.executable, "-c", _SIGTERM_IN_DCP_SAVE, "train", "--model", str(zoo_dir / "qwen3"), "--steps", "4", "--seq-len", "32",
         "--batch", "2", "--checkpoint-dir", str(folder), "--checkpoint-every", "1", "--json"],
        check=False, capture_output=True, text=True, timeout=300, cwd=REPO,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert completed.returncode == TERMINATED_EXIT, completed.stderr[-3000:]
    assert [line for line in completed.stderr.splitlines() if line.strip()] == [TERMINATED_LINE]
    assert [p.name for p in complete_checkpoints(folder)] == ["step-000001"] and incomplete_checkpoints(folder) == []
    # The previous checkpoint loads; a Ctrl-C inside DCP's load is itself too, not "cannot load checkpoint".
    loaded = load_model(ModelChoice(str(zoo_dir / "qwen3")), torch.device("cpu"), torch.float32)
    optimizer, _ = build_optimizer(loaded.model, OptimConfig(), 4)
    layout = Layout(world_size=1, rank=0, local_rank=0, dp_shard=1, tp=1)
    assert load_checkpoint(folder / "step-000001", loaded.model, optimizer, layout)["step"] == 1

    def interrupted_read_data(self, plan, planner):
        raise KeyboardInterrupt

    monkeypatch.setattr(fs.FileSystemReader, "read_data", interrupted_read_data)
    with pytest.raises(KeyboardInterrupt):
        load_checkpoint(folder / "step-000001", loaded.model, optimizer, layout)


def test_an_interruption_found_behind_the_error_that_replaced_it():
    # SIGTERM inside torch.save's zip writer: the writer's __exit__ raises a RuntimeError while the Terminated
    # unwinds, and DCP wraps that RuntimeError in a CheckpointException (a clean-clone CI run saw exit 1).
    from torch.distributed.checkpoint.api import CheckpointException

    from assay.core.cli import Terminated
    from assay.train.checkpoint import _interruption

    def replaced() -> RuntimeError:
        try:
            try:
                raise Terminated()
            finally:
                raise RuntimeError("unexpected pos 704 vs 598")
        except RuntimeError as error:
            return error

    hidden = replaced()
    assert isinstance(_interruption(CheckpointException("save", {0: (hidden, None)})), Terminated)
    assert isinstance(_interruption(hidden), Terminated)  # torch.save outside DCP: the error itself
    assert _interruption(CheckpointException("save", {0: (RuntimeError("disk"), None)})) is None
    assert _interruption(OSError("no space")) is None
