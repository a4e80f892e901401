"""The real `assay` command in a subprocess, for tests in any folder.

It lives here, not in a conftest.py: several folders have their own conftest.py, and which one a bare
`import conftest` finds depends on the order pytest collected them in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_assay(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real `assay` command in a subprocess: exit code, stdout and stderr as a user sees them."""
    return subprocess.run(
        [sys.executable, "-m", "assay", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
        env=os.environ.copy() | (env or {}),
    )


def run_torchrun(processes: int, *assay_args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc-per-node N -m assay ...`; the whole process group is
    killed on timeout, so no rank outlives the test."""
    env = os.environ | {
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    } | (env or {})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), "-m", "assay", *assay_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"torchrun with {processes} processes did not finish in {timeout} s:\n{stderr[-3000:]}") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
