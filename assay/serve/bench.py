"""`assay serve-bench`: drive the engine with synthetic arrivals in real time and report what serving cost.

Arrivals (the reference system's lesson: staggered arrivals behave differently from fixed batches):
  poisson   exponential gaps at --rate requests/s: the running count wanders, so without buckets new
            decode widths keep appearing, each compiled the first time it is seen
  burst     --burst-size requests every --burst-interval seconds
  fixed     --concurrency requests at once, run to completion, again until --requests are done
A run is one (prompt length, mode[, concurrency]) cell; modes: buckets (warm-up compiles every width),
none (--no-buckets: widths compile when first seen) and eager (nothing compiled). Every run builds a
fresh engine over the same loaded model and, by default, a fresh inductor cache folder, so no run
reuses another's compiled kernels and compile costs are those of a cold start.

Prompts are windows of the embedded corpus, tokenized by the checkpoint's own tokenizer.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import torch

from assay.core.errors import AssayError
from assay.serve.engine.config import EngineConfig
from assay.serve.engine.engine import Engine
from assay.serve.engine.scheduler import AUTO_BUCKETS

ARRIVALS = ("poisson", "burst", "fixed")
MODES = ("buckets", "none", "eager")


@dataclass(frozen=True)
class ServeBenchRequest:
    model: str
    arrivals: str = "poisson"
    rate: float = 20.0  # poisson: requests per second
    burst_size: int = 8
    burst_interval_s: float = 1.0
    concurrency: tuple[int, ...] = (8,)  # fixed: sequences submitted at once (one run per value)
    requests: int = 100  # per run
    prompt_tokens: tuple[int, ...] = (128,)  # one run per value
    max_tokens: int = 32
    modes: tuple[str, ...] = ("buckets",)
    buckets: tuple[int, ...] | str = AUTO_BUCKETS  # what EngineConfig.buckets takes
    max_seqs: int = 64
    device: str = "cpu"
    backend: str = "inductor"
    state_dtype: str = "float32"
    dtype: str = "float32"  # the weights' (--dtype)
    time_limit_s: float = 300.0  # per run: then every unfinished request is aborted
    seed: int = 0
    check_eager: bool = False
    fresh_compile_cache: bool = True
    max_prefill_tokens: int | None = None  # the engine's per-step prefill budget (None: the engine's default, EngineConfig)

    def validate(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise AssayError(f"--arrivals {self.arrivals!r}: expected one of {', '.join(ARRIVALS)}")
        unknown = [mode for mode in self.modes if mode not in MODES]
        if unknown or not self.modes:
            raise AssayError(f"--modes {','.join(self.modes)!r}: expected a list of {', '.join(MODES)}")
        if self.requests < 1:
            raise AssayError(f"--requests must be at least 1, got {self.requests}")
        if not self.prompt_tokens or min(self.prompt_tokens) < 1:
            raise AssayError("--prompt-tokens: expected positive lengths such as 2048,8192")
        if self.max_tokens < 1:
            raise AssayError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.arrivals == "poisson" and not self.rate > 0:
            raise AssayError(f"--rate must be > 0 requests/s, got {self.rate}")
        if self.arrivals == "burst" and (self.burst_size < 1 or self.burst_interval_s < 0):
            raise AssayError("--burst-size must be >= 1 and --burst-interval >= 0")
        if self.arrivals == "fixed" and (not self.concurrency or min(self.concurrency) < 1):
            raise AssayError("--concurrency: expected positive counts such as 1,8,32,64")
        if self.time_limit_s <= 0:
            raise AssayError(f"--time-limit must be positive, got {self.time_limit_s}")
        from assay.serve.runner.weights import weight_dtype

        weight_dtype(self.dtype)


@dataclass
class ServeBenchRun:
    arrivals: str
    mode: str
    prompt_tokens: int
    concurrency: int | None  # fixed arrivals only
    max_seqs: int
    requests_sent: int
    requests_finished: int
    timed_out: bool
    wall_s: float
    stats: dict = field(repr=False)  # Engine.stats().as_dict()

    def summary(self) -> dict:
        stats = self.stats
        return {
            "arrivals": self.arrivals, "mode": self.mode, "prompt": self.prompt_tokens, "concurrency": self.concurrency,
            "requests": f"{self.requests_finished}/{self.requests_sent}" + (" (time limit)" if self.timed_out else ""),
            "steps": stats["decode_steps"], "compiles": stats["compiles"], "warmup_compiles": stats["warmup_compiles"],
            "compile_share": stats["compile_share"], "tokens_per_s": stats["output_tokens_per_s"],
            "ttft_p50": stats["ttft_s"]["p50"], "ttft_p99": stats["ttft_s"]["p99"],
            "tpot_p50": stats["tpot_s"]["p50"], "tpot_p99": stats["tpot_s"]["p99"],
            "state_bytes": stats["memory"]["state_bytes_per_sequence"],
        }


SUMMARY_COLUMNS = [
    "arrivals", "mode", "prompt", "concurrency", "requests", "steps", "compiles", "warmup_compiles", "compile_share",
    "tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "state_bytes",
]


@dataclass
class ServeBenchResult:
    request: ServeBenchRequest
    model_type: str
    device: str
    runs: list[ServeBenchRun]

    def as_dict(self) -> dict:
        return {
            "request": asdict(self.request),
            "model_type": self.model_type,
            "device": self.device,
            "torch": torch.__version__,
            "runs": [asdict(run) | {"summary": run.summary()} for run in self.runs],
        }


# ---------------------------------------------------------------- arrivals and prompts
def arrival_times(request: ServeBenchRequest, rng: random.Random) -> list[float]:
    """Seconds after the start at which each request arrives (poisson and burst; fixed is driven by waves)."""
    if request.arrivals == "poisson":
        times, clock = [], 0.0
        for _ in range(request.requests):
            clock += rng.expovariate(request.rate)
            times.append(clock)
        return times
    if request.arrivals == "burst":
        return [(index // request.burst_size) * request.burst_interval_s for index in range(request.requests)]
    return [0.0] * request.requests


def corpus_token_ids(tokenizer) -> list[int]:
    from assay.zoo.corpus import corpus_text

    return tokenizer(corpus_text())["input_ids"]


def make_prompts(corpus_ids: list[int], length: int, count: int, rng: random.Random) -> list[list[int]]:
    """`count` windows of `length` corpus tokens at random offsets (the corpus repeated if it is shorter)."""
    ids = corpus_ids
    while len(ids) < length + 1:
        ids = ids + corpus_ids
    return [ids[start : start + length] for start in (rng.randrange(0, len(ids) - length) for _ in range(count))]


@contextlib.contextmanager
def fresh_inductor_cache(enabled: bool) -> Iterator[None]:
    """A new, empty inductor cache folder for the block: no run reuses another run's compiled kernels."""
    if not enabled:
        yield
        return
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="assay-serve-bench-inductor-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


# ---------------------------------------------------------------- one run
def _engine_config(request: ServeBenchRequest, mode: str, prompt_tokens: int) -> EngineConfig:
    # Each run's KV slot is sized for its own prompt: a 2K run does not pay for an 8K cache.
    return EngineConfig(
        max_seqs=request.max_seqs,
        buckets=None if mode == "none" else request.buckets,
        eager=mode == "eager",
        device=request.device,
        backend=request.backend,
        state_dtype=request.state_dtype,
        max_waiting=request.requests,  # the benchmark measures serving, not rejection
        max_prompt_tokens=prompt_tokens,
        max_new_tokens=request.max_tokens,
        max_len=prompt_tokens + request.max_tokens,
        check_eager=request.check_eager and mode != "eager",
        dtype=request.dtype,
        **({} if request.max_prefill_tokens is None else {"max_prefill_tokens": request.max_prefill_tokens}),  # None: the engine's default
    )


def run_one(engine: Engine, request: ServeBenchRequest, prompts: list[list[int]], concurrency: int | None) -> tuple[int, int, bool, float]:
    """Drive one engine in real time: (requests sent, requests finished, timed out?, wall seconds)."""
    rng = random.Random(request.seed)
    arrivals = arrival_times(request, rng)
    engine.warm_up()  # before the clock: a server warms up before it accepts requests
    sent = finished = 0
    timed_out = False
    start = time.perf_counter()
    live: set[str] = set()
    while sent < len(prompts) or live:
        elapsed = time.perf_counter() - start
        if elapsed > request.time_limit_s:
            timed_out = True
            for request_id in live:
                engine.abort(request_id)
            engine.step()
            break
        if concurrency is not None:  # fixed batches: the next wave when the last one has finished
            if not live:
                for _ in range(min(concurrency, len(prompts) - sent)):
                    engine.add_request(f"r{sent}", prompts[sent], request.max_tokens)
                    live.add(f"r{sent}")
                    sent += 1
        else:
            while sent < len(prompts) and arrivals[sent] <= elapsed:
                engine.add_request(f"r{sent}", prompts[sent], request.max_tokens)
                live.add(f"r{sent}")
                sent += 1
        if not live:
            time.sleep(max(0.0, min(arrivals[sent] - elapsed, 0.05)))
            continue
        for event in engine.step():
            if event.finished:
                live.discard(event.request_id)
                finished += event.finish_reason != "abort"
    return sent, finished, timed_out, time.perf_counter() - start


def run_serve_bench(request: ServeBenchRequest, progress: bool = True) -> ServeBenchResult:
    request.validate()
    from assay.core.compiling import reset
    from assay.core.device import resolve_device
    from assay.core.progress import progress_bar
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.runner.weights import load_slot_model
    from assay.serve.runner.sizing import check_max_len

    device = resolve_device(request.device)
    folder = checkpoint_dir(request.model)
    max_len = max(request.prompt_tokens) + request.max_tokens
    check_max_len(folder, max_len, "--prompt-tokens + --max-tokens")  # the longest run's slot length
    slot_model = load_slot_model(folder, device, max_len, request.dtype)
    first = Engine(slot_model, replace(_engine_config(request, "eager", 1), max_seqs=1, buckets=(1,)), tokenizer_dir=folder)
    corpus_ids = corpus_token_ids(first.tokenizer)
    del first
    cells = [
        (prompt_tokens, mode, concurrency)
        for prompt_tokens in request.prompt_tokens
        for mode in request.modes
        for concurrency in (request.concurrency if request.arrivals == "fixed" else (None,))
    ]
    runs = []
    with progress_bar("serve-bench", total=len(cells), enabled=progress) as advance:
        for prompt_tokens, mode, concurrency in cells:
            prompts = make_prompts(corpus_ids, prompt_tokens, request.requests, random.Random(request.seed + prompt_tokens))
            with fresh_inductor_cache(request.fresh_compile_cache and mode != "eager"):
                reset()  # dynamo forgets the previous run's graphs: every run compiles from scratch
                engine = Engine(slot_model, _engine_config(request, mode, prompt_tokens), tokenizer_dir=folder)
                sent, finished, timed_out, wall_s = run_one(engine, request, prompts, concurrency)
            runs.append(
                ServeBenchRun(request.arrivals, mode, prompt_tokens, concurrency, request.max_seqs, sent, finished, timed_out, wall_s,
                              engine.stats().as_dict())
            )
            del engine
            advance(f"{mode} prompt {prompt_tokens}" + (f" x{concurrency}" if concurrency else ""))
    return ServeBenchResult(request, slot_model.model_type, str(device), runs)


# ---------------------------------------------------------------- plot
def plot_serve_bench(runs: list[dict], path: str | Path, title: str = "serve-bench") -> Path:
    """Three panels per run: compile share of decode time, output tokens/s, TTFT and TPOT percentiles."""
    from assay.core.metrics import new_figure, save_figure

    labels = [_run_label(run) for run in runs]
    fig, axes = new_figure(ncols=3, size=(max(5.0, 0.9 * len(runs) + 2.5), 4.2))
    share_ax, throughput_ax, latency_ax = axes[0]
    positions = list(range(len(runs)))
    shares = [100 * (run["stats"]["compile_share"] or 0.0) for run in runs]
    share_ax.bar(positions, shares, color=["tab:red" if run["mode"] == "none" else "tab:blue" for run in runs])
    share_ax.set_ylabel("compile share of decode time (%)")
    share_ax.set_title("steps that compiled")
    throughput_ax.bar(positions, [run["stats"]["output_tokens_per_s"] or 0.0 for run in runs], color="tab:green")
    throughput_ax.set_ylabel("output tokens/s (all sequences)")
    throughput_ax.set_title("throughput")
    width = 0.13
    for offset, (metric, q, color) in enumerate(
        [("ttft_s", "p50", "#9ecae1"), ("ttft_s", "p95", "#4292c6"), ("ttft_s", "p99", "#08519c"),
         ("tpot_s", "p50", "#fdae6b"), ("tpot_s", "p95", "#f16913"), ("tpot_s", "p99", "#a63603")]
    ):
        values = [(run["stats"][metric][q] or 0.0) * 1000 for run in runs]
        latency_ax.bar([p + (offset - 2.5) * width for p in positions], values, width, label=f"{metric[:4].upper()} {q}", color=color)
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("ms")
    latency_ax.set_title("latency percentiles")
    latency_ax.legend(fontsize=7)
    for ax in (share_ax, throughput_ax, latency_ax):
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.suptitle(title, y=1.03)
    return save_figure(fig, path)


def _run_label(run: dict) -> str:
    label = f"{run['mode']} {run['prompt_tokens']}"
    if run.get("concurrency"):
        label += f" x{run['concurrency']}"
    return label
