"""What serving cost: compiles and their share of decode time, throughput, latency percentiles,
state memory per sequence, and how far compiled logits are from eager ones.

The reference system's finding is the reason for this module: steps that compiled a new decode width
were 1.1% of its steps but 47.5% of its decode time, a cost invisible in a fixed-batch benchmark. So
every decode step is recorded (width, running sequences, whether it compiled, how long), and the
compile share is reported next to throughput and latency, never folded into an average.

Definitions (`EngineStats.as_dict()` keys):
  compile_share          wall time of decode steps that compiled / all decode time (prefill excluded)
  compile_s              dynamo's own compile time inside those steps (`_compile.compile_inner`)
  ttft                   request added -> its first token (queueing + prefill), seconds
  tpot                   per finished request: (last token - first token) / (tokens - 1), seconds
Totals (steps, tokens, compiles) cover the engine's whole life; medians and percentiles the most recent
RECENT steps and finished requests, so a server that runs for days keeps bounded memory.
  output_tokens_per_s    every output token of every request / wall time from the first request to the last token
  output_token_cost_s    median over decode steps that did not compile of step time / sequences in the step
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from assay.core.metrics import percentile

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class StepRecord:
    step: int
    width: int  # rows in the batch, padding included
    running: int  # real sequences in it
    compiled: bool  # dynamo produced a graph during this step
    compile_s: float  # dynamo's compile time inside the step (0 when it did not compile)
    step_s: float  # wall time of the decode call, device synchronised


@dataclass
class EagerCheck:
    """Compiled vs eager logits on the same decode inputs, over a run (real rows only)."""

    steps: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0  # the largest per-step ||compiled - eager|| / ||eager||

    def add(self, max_abs: float, rel: float) -> None:
        self.steps += 1
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, rel)


@dataclass
class RequestTiming:
    added: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    finish_reason: str | None = None

    def tpot(self) -> float | None:
        """(last token - first token) / (tokens - 1); None below two tokens."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)


@dataclass(frozen=True)
class EngineTotals:
    """The engine's running totals and its pool's occupancy: what a metrics scrape reads, copied in O(widths)
    (never the per-step or per-request records)."""

    output_tokens: int
    decode_steps: int
    warmup_compiles: int
    warmup_s: float
    compiles: int
    compile_s: float
    prefill_warmup_compiles: int
    prefill_compiles: int
    running: int
    waiting: int
    free_slots: int
    slots: int
    state_bytes_per_sequence: int


@dataclass(frozen=True)
class MemoryFacts:
    state_dtype: str
    state_bytes_per_sequence: int  # what one slot holds (for a KV cache: at the pool's max_len)
    constant_state: bool  # True for a fixed-size state, False for a cache that grows with the sequence
    max_len: int | None  # the KV pool's length per slot, None for a fixed state
    kv_reference: str  # the attention layout the KV figures assume
    kv_dtype: str
    kv_bytes_per_sequence: dict[int, int]  # tokens -> bytes of that layout's key/value cache
    pool_bytes: int  # every slot and the scratch row


# A server runs for days: totals are running sums, while per-step records and finished requests' timings
# (what medians and percentiles are computed over) are kept for the most recent RECENT only.
RECENT = 100_000


@dataclass
class EngineStats:
    model_type: str
    mode: str  # "buckets", "no-buckets" or "eager"
    buckets: list[int] | None
    max_seqs: int
    memory: MemoryFacts
    warmup_widths: list[int] = field(default_factory=list)
    warmup_compiles: int = 0
    warmup_s: float = 0.0
    # totals over the engine's life
    decode_steps: int = 0
    decode_s: float = 0.0
    real_rows: int = 0
    all_rows: int = 0
    widths: Counter = field(default_factory=Counter)
    compiled: list[StepRecord] = field(default_factory=list)  # every step that compiled (at most one per width)
    prefills: int = 0  # prompts whose prefill completed
    prefill_s: float = 0.0
    prefill_calls: int = 0  # batched prefill calls (at most one per step)
    prefill_tokens: int = 0  # prompt tokens prefilled
    prefill_padded_tokens: int = 0  # rows x width summed over the calls (padding included)
    prefill_compiled_calls: int = 0  # calls that ran the compiled prefill (serve/runner/compiled_prefill.py)
    prefill_warmup_compiles: int = 0  # its graphs compiled at warm-up
    prefill_compiles: int = 0  # its graphs compiled while serving (a prompt waited on them)
    prefill_compile_s: float = 0.0
    requests_added: int = 0
    output_tokens: int = 0
    finished: Counter = field(default_factory=Counter)
    first_added: float | None = None
    last_token_at: float | None = None
    eager_check: EagerCheck | None = None
    # recent records
    steps: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    live: dict[str, RequestTiming] = field(default_factory=dict)  # requests not finished yet
    done: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # finished requests, newest last
    # Called on the stepping thread as each latency becomes known (a server's histograms): TTFT at a
    # request's first token, TPOT when it finishes with two tokens or more.
    ttft_observers: list[Callable[[float], None]] = field(default_factory=list, repr=False)
    tpot_observers: list[Callable[[float], None]] = field(default_factory=list, repr=False)

    # ---- recording (the engine calls these; add_step and request_* with its lock held) ----
    def add_prefill(self, result) -> None:
        """One prefill call (runner.PrefillResult)."""
        self.prefill_calls += 1
        self.prefill_s += result.seconds
        self.prefill_tokens += result.tokens
        self.prefill_padded_tokens += result.padded_tokens
        self.prefill_compiled_calls += result.compiled_call
        if result.compiled:  # a prompt waited on the compiler (no warm-up, or a shape it did not cover)
            self.prefill_compiles += 1
            self.prefill_compile_s += result.compile_s

    def add_step(self, record: StepRecord) -> None:
        self.decode_steps += 1
        self.decode_s += record.step_s
        self.real_rows += record.running
        self.all_rows += record.width
        self.widths[record.width] += 1
        if record.compiled:
            self.compiled.append(record)
        self.steps.append(record)

    def request_added(self, request_id: str, at: float) -> None:
        self.requests_added += 1
        self.live[request_id] = RequestTiming(added=at)
        if self.first_added is None:
            self.first_added = at

    def token(self, request_id: str, at: float) -> None:
        timing = self.live[request_id]
        if timing.first_token is None:
            timing.first_token = at
            for observe in self.ttft_observers:
                observe(at - timing.added)
        timing.last_token = at
        timing.tokens += 1
        self.output_tokens += 1
        self.last_token_at = at

    def request_finished(self, request_id: str, reason: str) -> None:
        timing = self.live.pop(request_id)
        timing.finish_reason = reason
        self.finished[reason] += 1
        self.done.append(timing)
        tpot = timing.tpot()
        if tpot is not None:
            for observe in self.tpot_observers:
                observe(tpot)

    def snapshot(self) -> EngineStats:
        """A copy whose containers the stepping thread no longer appends to (timings copied too)."""
        return replace(
            self,
            widths=Counter(self.widths),
            compiled=list(self.compiled),
            finished=Counter(self.finished),
            steps=deque(self.steps, maxlen=RECENT),
            live={key: replace(timing) for key, timing in self.live.items()},
            done=deque((replace(timing) for timing in self.done), maxlen=RECENT),
            eager_check=replace(self.eager_check) if self.eager_check is not None else None,
            warmup_widths=list(self.warmup_widths),
        )

    # ---- derived figures ----
    def compile_share(self) -> float | None:
        return None if self.decode_s == 0 else sum(r.step_s for r in self.compiled) / self.decode_s

    def output_token_cost_s(self) -> float | None:
        """Median over recent decode steps that did not compile of step time / sequences in the step: what
        one output token costs at steady state (the median shrugs off steps disturbed by other processes)."""
        costs = [r.step_s / r.running for r in self.steps if not r.compiled and r.running]
        return statistics.median(costs) if costs else None

    def elapsed_s(self) -> float | None:
        if self.first_added is None or self.last_token_at is None:
            return None
        return self.last_token_at - self.first_added

    def _timings(self) -> list[RequestTiming]:
        return list(self.done) + list(self.live.values())

    def ttfts(self) -> list[float]:
        return [t.first_token - t.added for t in self._timings() if t.first_token is not None]

    def tpots(self) -> list[float]:
        return [tpot for tpot in (t.tpot() for t in self.done) if tpot is not None]

    def as_dict(self) -> dict:
        compiled = self.compiled
        elapsed = self.elapsed_s()
        result = {
            "model_type": self.model_type,
            "mode": self.mode,
            "buckets": self.buckets,
            "max_seqs": self.max_seqs,
            "warmup_widths": self.warmup_widths,
            "warmup_compiles": self.warmup_compiles,
            "warmup_s": self.warmup_s,
            "decode_steps": self.decode_steps,
            "decode_s": self.decode_s,
            "compiles": len(compiled),
            "compile_s": sum(r.compile_s for r in compiled),
            "compiled_steps_s": sum(r.step_s for r in compiled),
            "compile_share": self.compile_share(),
            "compiled_step_fraction": len(compiled) / self.decode_steps if self.decode_steps else None,
            "compiled_steps": [asdict(r) for r in compiled],
            "widths": {str(w): n for w, n in sorted(self.widths.items())},
            "padding_fraction": (1 - self.real_rows / self.all_rows) if self.all_rows else None,
            "prefills": self.prefills,
            "prefill_s": self.prefill_s,
            "prefill_calls": self.prefill_calls,
            "prefill_tokens": self.prefill_tokens,
            "prefill_padding_fraction": (1 - self.prefill_tokens / self.prefill_padded_tokens) if self.prefill_padded_tokens else None,
            "prefill_compiled_calls": self.prefill_compiled_calls,
            "prefill_warmup_compiles": self.prefill_warmup_compiles,
            "prefill_compiles": self.prefill_compiles,
            "prefill_compile_s": self.prefill_compile_s,
            "requests": self.requests_added,
            "running_or_waiting": len(self.live),
            "finished": dict(self.finished),
            "output_tokens": self.output_tokens,
            "elapsed_s": elapsed,
            "output_tokens_per_s": self.output_tokens / elapsed if elapsed else None,
            "decode_tokens_per_s": self.real_rows / self.decode_s if self.decode_s else None,
            "output_token_cost_s": self.output_token_cost_s(),
            "memory": asdict(self.memory),
        }
        for name, values in (("ttft_s", self.ttfts()), ("tpot_s", self.tpots())):
            result[name] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
        state_bytes = self.memory.state_bytes_per_sequence
        result["memory"]["kv_over_state"] = {
            str(n): (b / state_bytes if state_bytes else math.nan) for n, b in self.memory.kv_bytes_per_sequence.items()
        }
        result["eager_check"] = asdict(self.eager_check) if self.eager_check is not None else None
        return result


def now() -> float:
    return time.perf_counter()
