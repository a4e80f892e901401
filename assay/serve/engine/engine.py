"""The serving engine: a slot pool, continuous batching, decode at bucketed widths, and its accounting.

    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(max_seqs=8, buckets=(1, 2, 4, 8)))
    engine.warm_up()                                  # compiles widths 1, 2, 4, 8 now, not while serving
    engine.add_request("r1", prompt_tokens, params=SamplingParams(max_tokens=32, temperature=0.7, seed=1))
    engine.add_request("r2", prompt_tokens, max_tokens=32)   # or the params' fields by name
    while engine.has_unfinished():
        for event in engine.step(): ...               # TokenEvent per new token (and per abort)
    engine.stats().as_dict()                          # compiles, compile share, tokens/s, TTFT/TPOT, memory

One step: abort what was asked to stop; then the scheduler's plan for it (serve/engine/scheduler.py, a pure
function of the queue and the pool): the waiting requests it admits take their slots, its prefill rows run in
one batched call (a prompt completed gives its first token from its last logits; a longer prompt is chunked
over steps), then one decode step for every running sequence at the plan's width, padding rows on the
scratch slot. The runner (serve/runner/runner.py) runs the model step; this module decides and keeps the
books: request tables, slots, sampling (serve/engine/sampling.py) and accounting (serve/engine/stats.py).

Threads: add_request / abort may be called from any thread (an HTTP server's event loop); step() from
one engine thread only. The waiting queue, the abort set and the set of live ids are guarded by a lock;
the pool, the running table and the accounting are touched by the stepping thread alone.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import replace
from typing import Callable

import torch

from assay.core.device import resolve_backend, resolve_device
from assay.core.errors import AssayError
from assay.serve.engine.config import EngineConfig, QueueFull, TokenEvent
from assay.serve.engine.guidance import Guidance
from assay.serve.engine.request import EngineRequest, PrefillJob, new_request
from assay.serve.engine.sampling import SamplingParams, TokenLogprob, prompt_logprobs, sample_tokens, token_logprobs
from assay.serve.engine.scheduler import Candidate, QueueView, StepPlan, queued_for_a_slot, schedule, warm_up_widths
from assay.serve.engine.stats import EagerCheck, EngineStats, EngineTotals, MemoryFacts, StepRecord, now
from assay.serve.runner.runner import DecodeInput, ModelRunner, PrefillInput
from assay.serve.runner.sizing import check_max_len, checkpoint_positions, fitted_slot_len
from assay.models.slots import KV_REFERENCE_DTYPE, SlotModel
from assay.serve.runner.weights import KV_REFERENCE_LENGTHS, load_slot_model, load_tokenizer, state_dtype


class Engine:
    def __init__(self, slot_model: SlotModel, config: EngineConfig, tokenizer_dir: str | os.PathLike | None = None):
        config.validate()
        self.config = config
        self.slot_model = slot_model
        self.device = resolve_device(config.device)
        self.backend = None if config.eager else resolve_backend(config.backend)
        self._tokenizer_dir = tokenizer_dir
        self._tokenizer = None
        dtype = state_dtype(config.state_dtype)
        max_len = config.slot_len()
        self.runner = ModelRunner(slot_model, config.max_seqs, dtype, max_len, self.device, self.backend, config.check_eager, config.decode_gemm, config.quantize,
                                  config.compile_prefill)
        self.pool = self.runner.pool
        self._max_len = max_len if slot_model.uses_max_len() else None

        self._lock = threading.RLock()  # re-entrant: _finish runs both inside step()'s critical section and from _emit
        self._waiting: deque[EngineRequest] = deque()
        self._aborts: set[str] = set()
        self._live_ids: set[str] = set()  # waiting or running
        self._running: dict[str, EngineRequest] = {}
        # Choices 1..n-1 of an admitted request whose prefill has not finished: their slots are taken; they
        # run once the prefill is copied into them.
        self._pending_forks: dict[str, EngineRequest] = {}
        self._prefilling: dict[str, PrefillJob] = {}  # admitted, prompt partly prefilled
        self._long_waited = False  # a long prompt got no prefill last step: it is offered this one (short_first)
        self._step_count = 0
        self._guidance = Guidance(config.max_seqs, self.vocab_size)  # structured outputs: the guided rows' token masks

        kv = slot_model.kv_reference()
        memory = MemoryFacts(
            state_dtype=str(dtype).removeprefix("torch."),
            state_bytes_per_sequence=self.pool.bytes_per_slot(),
            constant_state=not slot_model.uses_max_len(),
            max_len=self._max_len,
            kv_reference=kv.note,
            kv_dtype=str(KV_REFERENCE_DTYPE).removeprefix("torch."),
            kv_bytes_per_sequence={n: kv.bytes_per_sequence(n) for n in KV_REFERENCE_LENGTHS},
            pool_bytes=self.pool.total_bytes(),
        )
        self._stats = EngineStats(
            model_type=slot_model.model_type, mode=config.mode, buckets=list(config.buckets) if config.buckets else None,
            max_seqs=config.max_seqs, memory=memory, eager_check=EagerCheck() if config.check_eager and not config.eager else None,
        )

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, config: EngineConfig) -> Engine:
        """The slot_model of the architecture registry's entry for config.json's model_type; the checkpoint's own tokenizer."""
        config.validate()
        check_max_len(path, config.max_len)  # past the model's positions only where its rope scaling reaches
        device = resolve_device(config.device)
        if config.max_len is not None:
            slot_model = load_slot_model(path, device, config.max_len, config.dtype)
        else:
            # No --max-len: a slot reaches prompt + new tokens, but not past the positions the model was
            # trained for (its rotary table would be extended silently) nor past what the memory holds.
            slot_model = load_slot_model(path, device, min(config.slot_len(), checkpoint_positions(path) or config.slot_len()), config.dtype)
            if slot_model.uses_max_len():
                config = replace(config, max_len=fitted_slot_len(slot_model, config.slot_len(), config.max_seqs, config.state_dtype, device))
        from assay.models.hf_checkpoint import checkpoint_dir

        return cls(slot_model, config, tokenizer_dir=checkpoint_dir(path))

    @property
    def tokenizer(self):
        """The checkpoint's Hugging Face tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            if self._tokenizer_dir is None:
                raise AssayError("this engine was built without a checkpoint folder, so it has no tokenizer")
            self._tokenizer = load_tokenizer(self._tokenizer_dir)
        return self._tokenizer

    # ---------------------------------------------------------------- compile
    @property
    def compile_stats(self):
        """Graphs compiled by this engine's decode step (warm-up included)."""
        return self.runner.decoder.compile_stats

    def warm_up(self) -> None:
        """Compile every bucket width and the prefill's graphs now (padding rows only: the scratch slot), so serving
        never waits on the compiler. A no-op under --eager and --no-buckets (there, graphs compile when first needed)."""
        if self.config.eager or self.config.buckets is None:
            return
        widths = warm_up_widths(self.config.buckets, self.config.max_seqs)
        start = now()
        compiles = self.runner.warm_up(widths)
        prefill_compiles = self.runner.warm_up_prefill()
        self._stats.warmup_widths = widths
        self._stats.warmup_compiles += compiles
        self._stats.prefill_warmup_compiles += prefill_compiles
        self._stats.warmup_s += now() - start

    # ---------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_tokens: list[int], max_tokens: int | None = None, *,
                    params: SamplingParams | None = None, **fields) -> None:
        """Queue a prompt with what it asks of generation: params (a SamplingParams, as the HTTP edge builds it),
        or for scripts and tests its fields by name (add_request("r1", tokens, max_tokens=16, temperature=0.7)).
        n > 1: n choices (ids choice_ids(request_id, n)), prefilled once and copied into n slots, choice j
        sampling with seed + j. logprobs / prompt_logprobs: the chosen tokens' (each event's logprob) and the
        prompt's own (the first event's prompt_logprobs), with that many alternatives."""
        config = self.config
        if params is None:
            params = SamplingParams(**fields, **({} if max_tokens is None else {"max_tokens": max_tokens}))
        elif max_tokens is not None or fields:
            raise TypeError("add_request takes params or its fields, not both")
        request = new_request(config, self.vocab_size, self._max_len, request_id, prompt_tokens, params)
        members = [request, *request.forks]
        with self._lock:
            if any(m.request_id in self._live_ids for m in members):
                raise AssayError(f"request id {request_id!r} is already in use")
            if queued_for_a_slot([1 + len(r.forks) for r in self._waiting], self.pool.num_free) >= config.max_waiting:
                raise QueueFull(f"the waiting queue is full ({config.max_waiting} requests); retry later")
            self._waiting.append(request)
            for member in members:
                self._live_ids.add(member.request_id)
                self._stats.request_added(member.request_id, now())

    def abort(self, request_id: str) -> None:
        """Stop a waiting or running request; its slot is freed and an "abort" event emitted at the next step."""
        with self._lock:
            if request_id in self._live_ids:
                self._aborts.add(request_id)

    @property
    def vocab_size(self) -> int:
        return int(self.slot_model.args.vocab_size)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def free_slots(self) -> int:
        return self.pool.num_free

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._live_ids)

    # ---------------------------------------------------------------- the step
    def step(self) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        with self._lock:
            aborts, self._aborts = self._aborts, set()
            if aborts:
                kept = deque()
                for request in self._waiting:
                    # A waiting request's choices leave one by one; the first that stays carries the others.
                    members = [request, *request.forks]
                    staying = [m for m in members if m.request_id not in aborts]
                    events += [self._finish(m, "abort", token_id=-1) for m in members if m.request_id in aborts]
                    if staying:
                        staying[0].forks = staying[1:]
                        kept.append(staying[0])
                self._waiting = kept
            for request_id in sorted(aborts):  # sorted: a fork's abort after its first choice's (a hand-over)
                if request_id in self._prefilling:
                    events += self._abort_prefilling(request_id)
                elif request_id in self._running or request_id in self._pending_forks:
                    events.append(self._finish(self._running.get(request_id) or self._pending_forks[request_id], "abort", token_id=-1))
            plan = schedule(self._queue_view(), self.config)
            self._long_waited = plan.long_waited
            rows = self._admit(plan)
        events += self._run_prefill(rows)
        if self._running:
            events += self._decode_step(plan)
        return events

    def _queue_view(self) -> QueueView:
        """Called with the lock held: what the scheduler plans from."""
        return QueueView(
            prefilling=tuple(Candidate(rid, len(job.request.prompt), job.done, 0) for rid, job in self._prefilling.items()),
            waiting=tuple(Candidate(r.request_id, len(r.prompt), 0, 1 + len(r.forks)) for r in self._waiting),
            free_slots=self.pool.num_free, long_waited=self._long_waited,
        )

    def _admit(self, plan: StepPlan) -> list[tuple[PrefillJob, int]]:
        """Called with the lock held: the admitted requests take their slots (and their other choices'); the
        plan's rows as (job, tokens this step)."""
        admitted = set(plan.admit)
        if admitted:
            fresh = {r.request_id: r for r in self._waiting if r.request_id in admitted}
            self._waiting = deque(r for r in self._waiting if r.request_id not in admitted)
            for request_id in plan.admit:
                request = fresh[request_id]
                request.slot = self.pool.allocate()
                self._prefilling[request_id] = PrefillJob(request)
                for fork in request.forks:
                    fork.slot = self.pool.allocate()
                    self._pending_forks[fork.request_id] = fork
        return [(self._prefilling[row.request_id], row.tokens) for row in plan.prefill]

    def _abort_prefilling(self, request_id: str) -> list[TokenEvent]:
        """Called with the lock held: an aborted request being prefilled. Its slot is freed; a choice of it
        still waiting for the prefill takes the job over, with a copy of the state prefilled so far."""
        job = self._prefilling[request_id]
        request = job.request
        heirs = [fork for fork in request.forks if fork.request_id in self._pending_forks]
        if heirs:
            heir = heirs[0]
            del self._pending_forks[heir.request_id]
            if job.done:
                self.pool.copy_slot(request.slot, [heir.slot])
            heir.forks, request.forks = heirs[1:], []
            job.request = heir
            self._prefilling[heir.request_id] = job
        return [self._finish(request, "abort", token_id=-1)]

    def _run_prefill(self, rows: list[tuple[PrefillJob, int]]) -> list[TokenEvent]:
        """The plan's prefill call; the first tokens of the prompts it completes. With prompt_logprobs (echo) the
        call returns the logits at every position and each chunk's entries are kept as it is prefilled."""
        if not rows:
            return []
        inputs = [PrefillInput(job.request.prompt[job.done:job.done + chunk], job.request.slot, job.done) for job, chunk in rows]
        all_logits = any(job.request.prompt_logprobs is not None for job, _ in rows)
        result = self.runner.prefill(inputs, all_logits)
        with self._lock:
            self._stats.add_prefill(result)
        events: list[TokenEvent] = []
        for row, (job, chunk) in enumerate(rows):
            request = job.request
            if request.prompt_logprobs is not None:
                entries = prompt_logprobs(result.logits[row, :chunk], request.prompt[job.done:job.done + chunk + 1], request.prompt_logprobs)
                job.prompt_entries += entries if job.done == 0 else entries[1:]
            job.done += chunk
            if job.remaining:
                continue
            with self._lock:
                del self._prefilling[request.request_id]
                self._running[request.request_id] = request
                self._stats.prefills += 1
            request.next_position = len(request.prompt)
            last = result.logits[row, chunk - 1] if all_logits else result.logits[row]
            events += self._first_tokens(request, last, job.prompt_entries if request.prompt_logprobs is not None else None)
        return events

    def _first_tokens(self, request: EngineRequest, logits: torch.Tensor, prompt_entries=None) -> list[TokenEvent]:
        """A prefilled request's first token, and its other choices': their slots get a copy of its state
        and each samples from the same last logits [vocab] with its own generator."""
        with self._lock:
            forks = [fork for fork in request.forks if self._pending_forks.pop(fork.request_id, None) is not None]
            if forks:
                self.pool.copy_slot(request.slot, [fork.slot for fork in forks])
            for fork in forks:
                fork.next_position = request.next_position
                self._running[fork.request_id] = fork
        members = [request, *forks]
        events = self._sample_and_emit(logits[None].expand(len(members), -1), members)
        if prompt_entries is not None:
            for event in events:
                event.prompt_logprobs = prompt_entries
        return events

    def _decode_step(self, plan: StepPlan) -> list[TokenEvent]:
        running = list(self._running.values())
        width = plan.decode_width(len(running))
        pending = self._guidance.start([r.sampling for r in running])  # the masks fill while the forward runs
        result = self.runner.decode([DecodeInput(r.last_token, r.slot, r.next_position) for r in running], width)
        self._step_count += 1
        with self._lock:
            self._stats.add_step(StepRecord(self._step_count, width, len(running), result.compiled, result.compile_s, result.step_s))
            if result.eager_diff is not None:
                self._stats.eager_check.add(*result.eager_diff)
        for request in running:
            request.next_position += 1
        return self._sample_and_emit(result.logits, running, pending)

    def _sample_and_emit(self, logits: torch.Tensor, requests: list[EngineRequest], pending=None) -> list[TokenEvent]:
        # logits: [N, vocab] -> one token per request (drawn from the grammar's mask), with the model's own log-probabilities
        samplings = [request.sampling for request in requests]
        tokens = sample_tokens(self._guidance.constrain(logits, samplings, pending), samplings)
        logprobs = token_logprobs(logits, tokens, samplings)
        self._guidance.advance(samplings, tokens)
        return [self._emit(request, token, logprob) for request, token, logprob in zip(requests, tokens, logprobs)]

    def _emit(self, request: EngineRequest, token: int, logprob: TokenLogprob | None = None) -> TokenEvent:
        index = len(request.generated)
        request.generated.append(token)
        request.sampling.append(token)
        request.last_token = token
        self._stats.token(request.request_id, now())
        # A grammar's verdict first: a matcher in error ends as "error" even on a stop token.
        reason = self._guidance.finished(request.sampling) or ("stop" if token in request.stop_token_ids else None)
        reason = reason or ("length" if len(request.generated) >= request.max_tokens else None)
        if reason is not None:
            with self._lock:
                event = self._finish(request, reason, token_id=token, index=index)
        else:
            event = TokenEvent(request.request_id, token, index, False, None)
        event.logprob = logprob
        return event

    def _finish(self, request: EngineRequest, reason: str, token_id: int, index: int | None = None) -> TokenEvent:
        """Called with the lock held: the request leaves the live set and gives its slot back."""
        held = any(table.pop(request.request_id, None) is not None for table in (self._running, self._pending_forks, self._prefilling))
        if request.slot >= 0 and held:
            self.pool.release(request.slot)
            request.slot = -1
        self._live_ids.discard(request.request_id)
        self._aborts.discard(request.request_id)
        self._stats.request_finished(request.request_id, reason)
        return TokenEvent(request.request_id, token_id, len(request.generated) if index is None else index, True, reason)

    def _slot_holders(self) -> int:
        """Choices holding a slot: running, being prefilled, or waiting for their first choice's prefill."""
        return len(self._running) + len(self._prefilling) + len(self._pending_forks)

    # ---------------------------------------------------------------- results
    def stats(self) -> EngineStats:
        """A snapshot of the accounting so far, safe to read from another thread while step() runs."""
        with self._lock:
            return self._stats.snapshot()

    def totals(self) -> EngineTotals:
        """The running totals and the pool's occupancy, without stats()' copy of the recent records."""
        with self._lock:
            stats = self._stats
            return EngineTotals(
                output_tokens=stats.output_tokens, decode_steps=stats.decode_steps, warmup_compiles=stats.warmup_compiles,
                warmup_s=stats.warmup_s, compiles=len(stats.compiled), compile_s=sum(r.compile_s for r in stats.compiled),
                prefill_warmup_compiles=stats.prefill_warmup_compiles, prefill_compiles=stats.prefill_compiles,
                running=self._slot_holders(), waiting=len(self._waiting), free_slots=self.pool.num_free,
                slots=self.config.max_seqs, state_bytes_per_sequence=stats.memory.state_bytes_per_sequence,
            )

    def observe_latencies(self, ttft: Callable[[float], None], tpot: Callable[[float], None]) -> None:
        """Call ttft(seconds) at each request's first token and tpot(seconds) as each finishes (on the stepping thread)."""
        with self._lock:
            self._stats.ttft_observers.append(ttft)
            self._stats.tpot_observers.append(tpot)

    def generated_tokens(self, request_id: str) -> list[int] | None:
        """Tokens generated so far for a running request (None once it left the engine)."""
        request = self._running.get(request_id)
        return list(request.generated) if request else None


def run_to_completion(engine: Engine, max_steps: int = 1_000_000) -> dict[str, list[int]]:
    """Step until nothing is left; every request's generated tokens (aborts excluded), for tests and scripts."""
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return tokens
        for event in engine.step():
            if event.token_id >= 0:
                tokens.setdefault(event.request_id, []).append(event.token_id)
    raise RuntimeError(f"requests still unfinished after {max_steps} steps")


