"""What the benchmark scripts share: where results go, the machine and its load, the matmul and read rates, an `assay serve` process.

Every script puts the repository root on sys.path once (its first lines), then imports this module as
`bench.common`, so `python bench/<system>/<name>.py` runs from a plain checkout. Results are written with
assay.core.files.atomic_write_json and assay.core.metrics.save_figure (a killed run leaves the last file whole).
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# The vector instructions a CPU matmul library picks its kernels by: what separates two machines' floors.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve")


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def machine() -> dict:
    """The CPU's model, its vector flags, cores and the load average now: recorded next to every figure."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(), "flags": [f for f in VECTOR_FLAGS if f in flags],
            "cores": os.cpu_count(), "loadavg": load_average(), "host": platform.node(), "python": platform.python_version()}


def load_average() -> list[float]:
    """os.getloadavg() rounded: the machine is shared, and a busy one slows every figure."""
    return [round(value, 2) for value in os.getloadavg()]


def best_of(fn, repeats: int) -> float:
    """The fastest of `repeats` calls of fn after one warm-up call, in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_floor(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of this machine's best n x n x n matmul in `dtype`: the compute floor a benchmark is held to."""
    import torch

    from assay.core.metrics import measure_peak_flops

    return measure_peak_flops("cpu", getattr(torch, dtype), n=n, repeats=repeats)


def read_rate(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of one pass over a float32 tensor (sum): what a decode step's weight reads run at, at best."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    return x.numel() * 4 / best_of(x.sum, repeats)


def start_server(flags: list[str], env: dict | None = None, stderr=subprocess.PIPE, timeout: float | None = None) -> tuple[subprocess.Popen, str, float]:
    """`python -m assay serve FLAGS` in a subprocess (pass `--port 0`): (process, its URL, seconds until it printed it).

    The URL is the last word of the first stdout line; no such line within `timeout` seconds kills the
    process and raises SystemExit with its stderr's tail (a file's, when stderr is a file object)."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "assay", "serve", *map(str, flags)], stdout=subprocess.PIPE, stderr=stderr, text=True,
                               env=os.environ.copy() | (env or {}))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines or "http://" not in lines[0]:
        process.kill()
        if stderr is subprocess.PIPE:
            tail = process.stderr.read()[-2000:]
        else:
            tail = Path(stderr.name).read_text()[-2000:] if hasattr(stderr, "name") else ""
        raise SystemExit(f"assay serve did not start: {lines[:1]} {tail}")
    return process, lines[0].rsplit(" ", 1)[-1].strip(), time.perf_counter() - start


def stop_server(process: subprocess.Popen, timeout: float = 120.0) -> int:
    """SIGINT (a clean shutdown, as Ctrl-C), killed past `timeout` seconds; its exit code."""
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    return process.returncode


def drive_clients(work: list, concurrency: int, ask, timeout: float = 900) -> tuple[list[dict], float]:
    """`concurrency` client threads take items of `work` until none is left, each sending ask(session, item)
    (an httpx.Client per thread: one keep-alive connection, so no request pays a connect); (answers, wall s)."""
    import httpx

    results, lock, queue = [], threading.Lock(), list(work)

    def client() -> None:
        with httpx.Client(timeout=timeout) as session:
            while True:
                with lock:
                    if not queue:
                        return
                    item = queue.pop()
                answer = ask(session, item)
                with lock:
                    results.append(answer)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - start


def corpus_prompts(model_dir: Path, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """`count` windows of `length` token ids of the embedded corpus (the model's tokenizer), at random offsets."""
    import random

    from transformers import AutoTokenizer

    from assay.zoo.corpus import corpus_text

    ids = AutoTokenizer.from_pretrained(str(model_dir)).encode(corpus_text())
    rng = random.Random(seed)
    return [ids[start:start + length] for start in (rng.randrange(len(ids) - length) for _ in range(count))]


def top_ops(fn, rows: int = 15) -> list[dict]:
    """torch.profiler's top ops by self CPU time over one call of fn: where a missed target's time goes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total, "calls": e.count}
            for e in events[:rows]]
