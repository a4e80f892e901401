"""The `assay` command for tests in any folder: through the CLI zygote (one pre-imported process that forks
each run), or as a real `python -m assay` process where the process itself is the point.

`run_assay` is the default: exit code, stdout and stderr as a user sees them, without paying torch's and
Transformers' imports (about 3 s) per call. `run_assay_process` starts a real interpreter, for the tests
whose point is the process: signals, a real process's exit code, import time and which modules load.
ASSAY_TEST_CLI=process sends every call to a real process (to compare the two); ASSAY_TEST_CLI_LOG=FILE
appends one JSON line per call (forked or process, seconds, the command).

It lives here, not in a conftest.py: several folders have their own conftest.py, and which one a bare
`import conftest` finds depends on the order pytest collected them in.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from helpers.cli_zygote import limit_file_size

REPO = Path(__file__).resolve().parents[2]
ZYGOTE = Path(__file__).with_name("cli_zygote.py")
# Variables the interpreter, torch, Transformers or huggingface_hub read once, at start or import (the
# zygote read them before the call): a call that changes one gets a real process.
READ_AT_IMPORT = ("PYTHON", "LD_", "MALLOC", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TORCH", "PYTORCH", "CUDA", "NCCL",
                  "MKL", "KMP", "GOMP", "THP_", "TOKENIZERS", "XDG_", "TRITON")
# Under those prefixes, but read when used: the child builds its sys.path from PYTHONPATH as the interpreter
# does; torch reads TORCHINDUCTOR_CACHE_DIR at each compile (and sets it in the process that compiled first,
# this one included); huggingface_hub reads HF_XET_HIGH_PERFORMANCE only to download (which datasets'
# import sets here, and no test does offline); Hugging Face's tokenizers read TOKENIZERS_PARALLELISM at each
# encode (Transformers' generate sets it here); KMP_DUPLICATE_LIB_OK is read by Intel's OpenMP when it loads,
# which this torch (GNU OpenMP) never does in the zygote (inductor's first compile sets it here).
READ_WHEN_USED = {"PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "HF_XET_HIGH_PERFORMANCE", "TOKENIZERS_PARALLELISM", "KMP_DUPLICATE_LIB_OK"}
READY_TIMEOUT_S = 300.0


def run_assay_process(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None,
                      file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """The real `assay` command in a subprocess: exit code, stdout and stderr as a user sees them."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "assay", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
            env=os.environ.copy() | (env or {}), preexec_fn=(lambda: limit_file_size(file_size_limit)) if file_size_limit else None,
        )
    except subprocess.TimeoutExpired as expired:  # subprocess.run hands back undecoded bytes here, even with text=True
        raise subprocess.TimeoutExpired(expired.cmd, expired.timeout, output=_text(expired.output), stderr=_text(expired.stderr)) from None


def run_assay(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None,
              file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """The `assay` command as a user runs it, forked from the pre-imported zygote (a real process where
    the call changes what is read at import, or where no zygote can be had). `file_size_limit`: no file
    over that many bytes can be written, as on a full disk."""
    full_env = os.environ.copy() | (env or {})
    zygote = _zygote()
    started = time.monotonic()
    if zygote is None or not zygote.accepts(full_env):
        completed, how = run_assay_process(*args, cwd=cwd, timeout=timeout, env=env, file_size_limit=file_size_limit), "process"
    else:
        completed = zygote.run([str(a) for a in args], Path(cwd or os.getcwd()).resolve(), full_env, timeout, file_size_limit)
        how = "forked"
    if os.environ.get("ASSAY_TEST_CLI_LOG"):  # which calls forked and how long each took, to profile the suite
        with open(os.environ["ASSAY_TEST_CLI_LOG"], "a") as log:
            log.write(json.dumps({"how": how, "s": round(time.monotonic() - started, 2), "args": [str(a) for a in args[:3]],
                                  "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "why": zygote and zygote.read_at_import(full_env)}) + "\n")
    return completed


class _Zygote:
    """This session's handle on tests/helpers/cli_zygote.py: a request per run, its exit code from a file."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="assay-cli-"))
        self.env = os.environ.copy()
        self._log = open(self.folder / "zygote.log", "wb")
        self._process = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=self.env, cwd=REPO)
        self._lock = threading.Lock()
        self._count = 0
        self.ready = json.loads(self._read_line(READY_TIMEOUT_S) or "{}").get("ready", False)

    def _read_line(self, timeout: float) -> str:
        readable, _, _ = select.select([self._process.stdout], [], [], timeout)
        return self._process.stdout.readline().decode() if readable else ""

    def read_at_import(self, env: dict) -> list[str]:
        """The variables this call changes that the zygote read at import: a reason to start a real process."""
        changed = {key for key in env.keys() | self.env.keys() if env.get(key) != self.env.get(key)} - READ_WHEN_USED
        return sorted(key for key in changed if key.startswith(READ_AT_IMPORT))

    def accepts(self, env: dict) -> bool:
        return self.ready and self._process.poll() is None and not self.read_at_import(env)

    def run(self, args: list[str], cwd: Path, env: dict, timeout: float, file_size_limit: int | None) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "assay", *args]
        with self._lock:
            self._count += 1
            stem = self.folder / f"run-{self._count}"
            request = {"args": args, "cwd": str(cwd), "env": env, "stdout": f"{stem}.out", "stderr": f"{stem}.err", "status": f"{stem}.status",
                       "file_size_limit": file_size_limit}
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
            answer = json.loads(self._read_line(60) or '{"error": "no answer"}')
        if "error" in answer:  # it has started threads since: forking it is no longer safe
            self.ready = False
            return run_assay_process(*args, cwd=cwd, timeout=timeout, env=env, file_size_limit=file_size_limit)
        status = Path(request["status"])
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            while not status.exists():
                if self._process.poll() is not None:
                    raise AssertionError(f"the CLI zygote died during `assay {' '.join(args)}`")
                if not timed_out and time.monotonic() > deadline:
                    _kill_group(answer["pid"])  # as subprocess.run: kill, collect what it wrote, raise
                    timed_out = True
                time.sleep(0.02)
        except BaseException:  # pytest's own timeout, Ctrl-C: the run does not outlive its test
            _kill_group(answer["pid"])
            raise
        returncode = int(status.read_text())
        stdout, stderr = (_decoded(Path(f"{stem}.{part}")) for part in ("out", "err"))
        for part in ("out", "err", "status"):
            Path(f"{stem}.{part}").unlink(missing_ok=True)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)

    def close(self) -> None:
        try:
            self._process.stdin.close()  # the zygote kills what still runs and exits
            self._process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _decoded(path: Path) -> str:
    return _text(path.read_bytes() if path.exists() else b"")


def _text(data: bytes | str | None) -> str:
    """As subprocess.run(text=True) decodes a pipe: the locale's encoding, universal newlines."""
    data = data.encode() if isinstance(data, str) else data or b""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_started: list[_Zygote | None] = []


def _zygote() -> _Zygote | None:
    """The session's zygote, started on the first call (from the main thread only: the zygote dies with
    the thread that started it, by PR_SET_PDEATHSIG); None where there is none to be had."""
    if _started:
        return _started[0]
    if os.environ.get("ASSAY_TEST_CLI") == "process" or not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    zygote = _Zygote()
    atexit.register(zygote.close)
    _started.append(zygote if zygote.ready else None)
    return _started[0]


# What a command may print on stderr before it refuses: its progress lines (what it loads, where it resumes).
PROGRESS = ("loading ", "resumed from ", "slot pool:")


def refusal_line(completed: subprocess.CompletedProcess, progress: tuple[str, ...] = PROGRESS) -> str:
    """The one `error: ...` line of a refused command (exit 2, no traceback), after nothing but progress lines."""
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == 2 and lines and lines[-1].startswith("error: "), completed.stderr[-3000:]
    assert all(line.startswith(progress) for line in lines[:-1]), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr + completed.stdout, completed.stderr[-3000:]
    return lines[-1]


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
