"""Run one function on N torch.distributed ranks on this machine and collect what each returned.

    results = run_on_ranks(check_fn, world_size=2, args=(4,))   # results[rank] = check_fn(4) on that rank

Each rank is a fresh process (spawn, never fork: a forked child inherits the parent's thread pools
and locks) with the usual environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) and a
process group initialised from it, so the function sees exactly what `torchrun` would give it.
A rank's exception comes back as RankError with that rank's traceback; a rank that hangs or dies
is killed at the timeout. Every process started here is joined or killed before returning.

The function is sent by reference (module, file, qualified name), not pickled, so functions in a
test file work even when pytest imports test files under names no child could import
(--import-mode=importlib): the child loads that file by path. Arguments and results are pickled.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import multiprocessing
import os
import pickle
import queue
import sys
import time
import traceback
from typing import Any, Callable

from assay.core.net import free_port

# After one rank fails, the others are usually blocked in a collective waiting for it: give them this
# long to report on their own, then kill them.
FAILURE_GRACE_S = 5.0


class RankError(RuntimeError):
    """One or more ranks raised; the message holds each failing rank's traceback."""


def init_from_env(backend: str = "gloo", timeout_s: float = 120.0) -> None:
    """init_process_group from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, as under torchrun."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def _function_reference(fn: Callable) -> tuple[str, str | None, str]:
    module = sys.modules.get(fn.__module__)
    module_file = getattr(module, "__file__", None)
    if "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>":
        raise ValueError(f"run_on_ranks needs a module-level function; got {fn.__qualname__}")
    return fn.__module__, module_file, fn.__qualname__


def _resolve_function(module_name: str, module_file: str | None, qualname: str) -> Callable:
    if module_name == "__main__" and module_file:
        module_name = "__mp_main__"  # spawn re-imports the parent's script under this name
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not module_file:
            raise
        spec = importlib.util.spec_from_file_location(f"_rank_module_{abs(hash(module_file))}", module_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _rank_main(reference, args, kwargs, rank, world_size, port, backend, threads, timeout_s, results) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    report: tuple
    try:
        import torch
        import torch.distributed as dist

        if threads:
            torch.set_num_threads(threads)
        fn = _resolve_function(*reference)
        init_from_env(backend, timeout_s)
        try:
            value = fn(*args, **kwargs)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        report = (rank, "ok", pickle.dumps(value))
    except BaseException:  # a rank's failure of any kind is reported, never swallowed
        report = (rank, "error", traceback.format_exc())
    results.put(report)


def run_on_ranks(
    fn: Callable,
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    backend: str = "gloo",
    timeout_s: float = 180.0,
    threads_per_rank: int | None = 1,
) -> list:
    """fn(*args, **kwargs) on `world_size` ranks; returns [result of rank 0, result of rank 1, ...].

    threads_per_rank: torch intra-op threads per process (1, as torchrun's OMP_NUM_THREADS default,
    so N ranks on a few cores do not oversubscribe them); None leaves torch's default.
    Raises RankError if any rank raised, TimeoutError if the ranks did not finish in timeout_s.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    reference = _function_reference(fn)
    processes = [
        context.Process(
            target=_rank_main,
            args=(reference, args, kwargs or {}, rank, world_size, port, backend, threads_per_rank, timeout_s, results),
            daemon=True,
            name=f"assay-rank-{rank}",
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    values: dict[int, bytes] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s

    def record(report: tuple) -> None:
        nonlocal deadline
        rank, status, payload = report
        if status == "ok":
            values[rank] = payload
        else:
            errors[rank] = payload
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)

    try:
        while len(values) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                record(results.get(timeout=min(1.0, remaining)))
                continue
            except queue.Empty:
                pass
            # A rank that died without reporting (killed, crashed in C++) would otherwise be waited for
            # until the timeout. A rank flushes its report before it exits, so read what is left
            # first: only a rank still missing after that died silently.
            exited = [r for r, p in enumerate(processes) if p.exitcode is not None and r not in values and r not in errors]
            if not exited:
                continue
            with contextlib.suppress(queue.Empty):
                while True:
                    record(results.get(timeout=0.2))
            for rank in exited:
                if rank not in values and rank not in errors:
                    errors[rank] = f"rank {rank} exited with code {processes[rank].exitcode} without reporting"
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
    finally:
        for process in processes:
            process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())) + 1.0)
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        results.close()
        results.join_thread()
    if errors:
        details = "\n".join(f"--- rank {rank} ---\n{text}" for rank, text in sorted(errors.items()))
        raise RankError(f"{len(errors)} of {world_size} ranks failed:\n{details}")
    missing = [rank for rank in range(world_size) if rank not in values]
    if missing:
        raise TimeoutError(f"ranks {missing} did not finish within {timeout_s:.0f} s (killed)")
    return [pickle.loads(values[rank]) for rank in range(world_size)]
