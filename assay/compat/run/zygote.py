"""A pre-imported process that forks one child per probe: isolation without paying the imports each time.

Measured on the 2-core machine (bench/results/sweep_zoo.json, cProfile of one warm probe): importing torch,
transformers and inductor, and hashing the triton install for the cache key, took about 10 s of a
17 s warm-cache probe. A sweep therefore starts one zygote (`python -m assay.compat.run.zygote`) that does
those imports once and forks a fresh child for every probe. Each probe still runs in its own process
(its own session, memory limit, stderr file, and death with its parent), so a segfault, a hang or an
out-of-memory kill stays a row of the dataset, exactly as with a freshly started interpreter.

Why forking is safe here: the zygote imports modules and computes cache keys, nothing else. It runs no
tensor operation (no OpenMP pool), initialises no device and compiles nothing. Importing leaves two
native helper threads (one from torch's import, jemalloc's background thread from pyarrow); both are
fork-safe (DataLoader workers fork processes that imported torch; jemalloc has fork handlers). Before
every fork the zygote checks that no Python thread and no further native thread has appeared since
it became ready; if one has, it refuses and the sweep says so.

Protocol: JSON lines. The sweep writes {"id", "module", "args", "env", "stderr", "memory_limit"} to the
zygote's stdin; the zygote answers {"id", "pid"} once the child is forked and {"exited": pid,
"returncode"} (negative: killed by that signal, as subprocess reports it) once it has reaped it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from assay.core.errors import AssayError
from assay.core.process import die_with_parent, limit_address_space

# Modules every probe imports; the zygote imports them once. Model-specific modules (modeling_llama, ...)
# stay per probe: Transformers loads them lazily and a sweep touches only some.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "transformers",
    "transformers.generation.utils",
    # What the first from_pretrained and tokenizer load of a process import lazily (modeling_utils, the
    # auto classes, quantizer and loss registries, torch.distributed.checkpoint): measured 1.6 s of a
    # tiny model's first load in a forked child, 0.5 s once these come with the zygote (docs in README).
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.auto.processing_auto",
    "transformers.quantizers.auto",
    "transformers.core_model_loading",
    "transformers.processing_utils",
    "transformers.loss.loss_utils",
    "transformers.integrations.sdpa_attention",
    "transformers.integrations.flex_attention",
    "torch.distributed.checkpoint",
    "huggingface_hub.serialization",
    "assay.compat.probe.execute",
    "assay.compat.probe.reference_cache",
    "assay.compat.probe.recipe",
    "assay.compat.run.worker",
    "assay.core.compile_cache",
)
# A sweep with --eval sets this in the zygote's environment: every probe then scores tasks through
# lm-eval, whose import (with datasets and evaluate) the zygote does once too. It starts no thread of its own.
PRELOAD_EVAL_ENV = "ASSAY_ZYGOTE_EVAL"
PRELOAD_EVAL = ("lm_eval.evaluator", "lm_eval.models.huggingface", "lm_eval.tasks", "assay.compat.probe.evaluation")
READY_TIMEOUT_S = 300.0


# --- the zygote process --------------------------------------------------------------------------


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _preload() -> None:
    import importlib

    for name in PRELOAD + (PRELOAD_EVAL if os.environ.get(PRELOAD_EVAL_ENV) else ()):
        importlib.import_module(name)
    # What inductor works out once per process (functools caches), measured per warm probe: which vector
    # ISA the C++ compiler and this CPU support (6 compile-and-dlopen subprocesses, 3.7 s), the triton
    # install's hash for cache keys (1.3 s), torch's own hash. Worked out here, every child inherits them.
    from torch._inductor import codecache, cpu_vec_isa

    for key_fn in (cpu_vec_isa.pick_vec_isa, codecache.torch_key, codecache.CacheBase.get_system):
        try:
            key_fn()
        except Exception:  # what cannot be worked out here is worked out by the child, as before
            pass


def _child(command: dict, zygote_pid: int) -> None:
    """In the forked child: become the probe process, run the module's main, never return."""
    code = 1
    try:
        os.setsid()  # its own process group: a timeout kills the probe and whatever it started
        die_with_parent()  # with the zygote (which dies with the sweep), as a subprocess probe dies with the sweep
        if os.getppid() != zygote_pid:  # the zygote died between fork and prctl
            os._exit(1)
        limit_address_space(command.get("memory_limit"))
        devnull = os.open(os.devnull, os.O_RDWR)
        stderr = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr, 2)
        os.closerange(3, 65536)  # the zygote's pipes to the sweep are not the probe's business
        os.environ.update(command.get("env") or {})
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))  # the zygote imported torch before the env said how many
        import importlib

        result = importlib.import_module(command["module"]).main(list(command["args"]))
        code = int(result or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> int:
    """The zygote's loop: fork on request, reap children, report both; exit when stdin closes."""
    # Replies go to the original stdout; anything else printed here (warnings) goes to stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    replies = os.fdopen(reply_fd, "w", buffering=1)

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")

    die_with_parent()  # with the sweep
    _preload()
    ready_threads = _thread_count()
    reply({"ready": True, "threads": ready_threads})

    children: set[int] = set()
    buffer = b""
    stdin_fd = sys.stdin.fileno()
    open_input = True
    while open_input or children:
        if open_input:
            readable, _, _ = select.select([stdin_fd], [], [], 0.05)
            if readable:
                chunk = os.read(stdin_fd, 65536)
                if not chunk:
                    open_input = False
                    for pid in children:  # the sweep is gone: so are its probes
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    command = json.loads(line)
                    threads = _thread_count()
                    if threads > ready_threads or threading.active_count() > 1:
                        reply({"id": command["id"], "error": f"the probe zygote started threads ({threads}, {ready_threads} when ready): "
                               "forking it is unsafe; use --fresh-interpreter"})
                        continue
                    pid = os.fork()
                    if pid == 0:
                        _child(command, os.getppid())
                    children.add(pid)
                    reply({"id": command["id"], "pid": pid})
        else:
            time.sleep(0.05)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            reply({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})
    return 0


# --- the sweep's side ----------------------------------------------------------------------------


class Zygote:
    """The sweep's handle on one zygote process; safe to use from several worker threads at once.

    Starting returns at once (the imports take seconds: the sweep plans meanwhile); the first spawn
    waits until the zygote is ready.
    """

    def __init__(self, env: dict | None = None):
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "assay.compat.run.zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=os.environ.copy() | (env or {}),
        )
        self._write_lock = threading.Lock()
        self._condition = threading.Condition()
        self._spawned: dict[int, dict] = {}
        self._exited: dict[int, int] = {}
        self._next_id = 0
        self._alive = True
        self.threads: int | None = None  # the zygote's native thread count when it became ready
        self._reader = threading.Thread(target=self._read_replies, name="zygote-replies", daemon=True)
        self._reader.start()

    def _read_replies(self) -> None:
        for line in self._process.stdout:
            message = json.loads(line)
            with self._condition:
                if "ready" in message:
                    self.threads = message["threads"]
                elif "exited" in message:
                    self._exited[message["exited"]] = message["returncode"]
                else:
                    self._spawned[message["id"]] = message
                self._condition.notify_all()
        with self._condition:
            self._alive = False
            self._condition.notify_all()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        with self._condition:
            self._condition.wait_for(lambda: self.threads is not None or not self._alive, timeout)
            if self.threads is not None:
                return
        self._log.seek(0)
        tail = self._log.read().decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise AssayError(f"the probe zygote did not start ({tail[0][:300]}); use --fresh-interpreter")

    def spawn(self, module: str, args: list[str], stderr_path: str | os.PathLike, env: dict | None = None, memory_limit_bytes: int | None = None) -> int:
        """Fork a child that runs `module.main(args)`; returns its pid (also its process-group id)."""
        self.wait_ready()
        with self._condition:
            command_id = self._next_id
            self._next_id += 1
        command = {"id": command_id, "module": module, "args": [str(a) for a in args], "env": env or {},
                   "stderr": str(stderr_path), "memory_limit": memory_limit_bytes}
        with self._write_lock:
            try:
                self._process.stdin.write((json.dumps(command) + "\n").encode())
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise AssayError("the probe zygote has exited") from None
        with self._condition:
            self._condition.wait_for(lambda: command_id in self._spawned or not self._alive)
            answer = self._spawned.pop(command_id, None)
        if answer is None:
            raise AssayError("the probe zygote has exited")
        if "error" in answer:
            raise AssayError(answer["error"])
        return answer["pid"]

    def wait(self, pid: int, timeout: float | None) -> tuple[int, bool]:
        """(returncode, timed_out): at the timeout the child's whole process group is killed."""
        with self._condition:
            self._condition.wait_for(lambda: pid in self._exited or not self._alive, timeout)
            if pid in self._exited:
                return self._exited.pop(pid), False
            zygote_gone = not self._alive  # its children died with it (PR_SET_PDEATHSIG)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        with self._condition:
            self._condition.wait_for(lambda: pid in self._exited or not self._alive)
            return self._exited.pop(pid, -signal.SIGKILL), not zygote_gone

    def close(self) -> None:
        """Close the zygote's input: it kills any probe still running, reaps it and exits."""
        if self.threads is None:  # still importing, nothing forked: no need to wait for it
            self._process.kill()
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_zygote(env: dict | None = None) -> Zygote | None:
    """A zygote for a sweep, or None where forking is unavailable (the sweep then starts fresh interpreters)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return None
    return Zygote(env)


if __name__ == "__main__":
    sys.exit(serve())
