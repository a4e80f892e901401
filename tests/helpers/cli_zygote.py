"""The tests' CLI zygote: imports torch, Transformers and assay's CLI once, then forks one `assay` run per request.

A fresh `python -m assay` spends about 3 s of a 2-core machine importing torch and Transformers before it
reads its first flag; the suite runs the CLI a few hundred times. This process pays the imports once per
test session and forks a child for every call. The child becomes what `python -m assay ARGS` would be:
its own session (a timeout kills its whole group), /dev/null on stdin, stdout and stderr on files, the
call's working folder, environment, `sys.path` and `sys.argv`, then `assay.cli.main()`; its exit code is
SystemExit's code, or the signal that killed it (negative, as subprocess reports it).

Forking is safe for the reasons `assay/compat/zygote.py` gives: this process imports modules and nothing
else (no tensor operation, so no OpenMP pool; no device; no compile), and it refuses to fork once a
Python thread or a further native thread has appeared (the caller then starts a real process).

Protocol: JSON lines on stdin, {"args", "cwd", "env", "stdout", "stderr", "status"} (paths); the reply on
stdout is {"pid"} (or {"error"}); once the child is reaped its exit code is written to the "status" file
(written beside it, then renamed, so the caller never reads half of it). Closing stdin kills every
running child and ends the zygote.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import sys
import threading
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The sweep's zygote (assay/compat/zygote.py) preloads what every probe imports (torch, dynamo, inductor,
# Transformers' lazily imported loaders) and works out inductor's per-process keys; this one does the same
# through it, wherever the compat package keeps it, then what the CLI itself needs.
COMPAT_ZYGOTE = ("assay.compat.run.zygote", "assay.compat.zygote")
PRELOAD = (
    "typer.rich_utils",  # Typer's help and error boxes: 2-3 s of a forked `--help` otherwise
    "rich.traceback",
    "rich.pretty",
    "safetensors.torch",
    "pyarrow.parquet",
    "assay.cli",
)
# The packages whose modules the commands import lazily (assay.compat.probe, assay.train.loop, ...): every
# module in them is imported here, except those that pull in a server, a browser or a cluster client.
PRELOAD_PACKAGES = ("assay.core", "assay.compat", "assay.train", "assay.models", "assay.kernels",
                    "assay.optim", "assay.recall", "assay.zoo", "assay.serve", "assay.selftest", "assay.app")
SKIP_MODULES = ("ray", "gradio", "lm", "uvicorn", "playwright")  # name parts (lm: lm_eval)


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _preload() -> None:
    """Import everything once. A name that has moved or cannot be imported is skipped: the child then
    imports what it needs itself, as a real process does."""
    import pkgutil

    for name in COMPAT_ZYGOTE:
        try:
            importlib.import_module(name)._preload()
            break
        except (ImportError, AttributeError):
            continue
    for name in ("torch", "transformers", *PRELOAD):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a preload is only a head start)
            pass
    for package_name in PRELOAD_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except Exception:  # noqa: BLE001
            continue
        for info in pkgutil.walk_packages(package.__path__, package_name + ".", onerror=lambda name: None):
            if set(info.name.replace(".", "_").split("_")) & set(SKIP_MODULES):
                continue
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001
                pass


def _base_path() -> list[str]:
    """sys.path without this script's folder and without this process's PYTHONPATH: what every child
    puts its own working folder and PYTHONPATH in front of."""
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in own]


def limit_file_size(limit: int) -> None:
    """A disk that holds no file over `limit` bytes: a write past it fails with EFBIG (SIGXFSZ, which
    would kill the process instead, is ignored), as on a full disk."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _as_python_m_assay(args: list[str]) -> None:
    """sys.argv and __main__ as `python -m assay` has them: Click names the program from both
    (`Usage: python -m assay ...`), and multiprocessing's spawn re-imports __main__ by its spec."""
    spec = importlib.util.find_spec("assay.__main__")
    main_module = types.ModuleType("__main__")
    main_module.__file__ = spec.origin
    main_module.__package__ = "assay"
    main_module.__spec__ = spec
    sys.modules["__main__"] = main_module
    sys.argv = [spec.origin, *args]


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message"): the interpreter prints it and exits 1
    return 1


def _child(request: dict, zygote_pid: int, base_path: list[str]) -> None:
    """In the forked child: become `python -m assay ARGS`, run it, never return."""
    code = 1
    try:
        os.setsid()  # its own process group: a timeout kills the run and whatever it started
        from assay.core.process import die_with_parent

        die_with_parent()
        if os.getppid() != zygote_pid:  # the zygote died between fork and prctl
            os._exit(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, 65536)  # the zygote's pipes are not the run's business
        if request.get("file_size_limit"):
            limit_file_size(request["file_size_limit"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        python_path = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *python_path, *base_path]  # as `python -m` builds it
        importlib.invalidate_caches()
        _as_python_m_assay(request["args"])
        import torch

        if os.environ.get("OMP_NUM_THREADS"):  # torch read it when this zygote imported it
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS; forks share one
            sys.modules["numpy"].random.seed()
        from assay.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 (what the interpreter does with an uncaught exception)
            sys.excepthook(*sys.exc_info())
            code = 1
        # The interpreter's own shutdown: wait for non-daemon threads, run atexit handlers, flush.
        threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 (the set-up above failed: its traceback on the run's stderr)
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 (a flush that fails at exit: the interpreter exits 120)
            code = 120
        if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt: the interpreter re-raises SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF if code >= 0 else 1)


def _write_status(path: str, returncode: int) -> None:
    with open(path + ".part", "w") as handle:
        handle.write(str(returncode))
    os.replace(path + ".part", path)


def _fork(request: dict, base_path: list[str]) -> int:
    sys.stdout.flush()  # nothing buffered here may be written twice
    sys.stderr.flush()
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, zygote_pid, base_path)
    return pid


def _reap(children: dict[int, str]) -> None:
    """Every finished child's exit code into its status file."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        if pid in children:
            _write_status(children.pop(pid), os.waitstatus_to_exitcode(status))


def serve() -> int:
    """Import, say ready, then fork on request and reap; exit when stdin closes."""
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # anything an import prints goes to the zygote's log, not into the replies
    replies = os.fdopen(reply_fd, "w", buffering=1)
    from assay.core.process import die_with_parent

    die_with_parent()  # with the test session
    _preload()
    # Every object so far lives as long as the zygote: out of the collector's sight, a child's collections
    # no longer walk (and so copy, page by page) the whole pre-imported heap. Measured: a forked `--help`
    # took 3.0 s of which 2.4 s were collections, 0.5 s with this.
    gc.freeze()
    base_path = _base_path()
    ready_threads = _thread_count()
    safe = threading.active_count() == 1
    replies.write(json.dumps({"ready": safe, "threads": ready_threads}) + "\n")
    if not safe:
        return 1
    children: dict[int, str] = {}
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.01 if children else None)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                request = json.loads(line)
                threads = _thread_count()
                if threads > ready_threads or threading.active_count() > 1:  # forking is no longer safe
                    replies.write(json.dumps({"error": f"the CLI zygote has {threads} threads ({ready_threads} when ready)"}) + "\n")
                else:
                    pid = _fork(request, base_path)
                    children[pid] = request["status"]
                    replies.write(json.dumps({"pid": pid}) + "\n")
        _reap(children)
    for pid in children:  # the session is gone: so are its runs
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(serve())
