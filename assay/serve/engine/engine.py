"""The serving engine: a slot pool, continuous batching, decode at bucketed widths, and its accounting.

    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(max_seqs=8, buckets=(1, 2, 4, 8)))
    engine.warm_up()                                  # compiles widths 1, 2, 4, 8 now, not while serving
    engine.add_request("r1", prompt_tokens, max_tokens=32)
    while engine.has_unfinished():
        for event in engine.step(): ...               # TokenEvent per new token (and per abort)
    engine.stats().as_dict()                          # compiles, compile share, tokens/s, TTFT/TPOT, memory

One step: abort what was asked to stop; one batched prefill call (serve/engine_prefill.py: prompts being
prefilled and waiting ones that fit free slots, right-padded, up to max_prefill_tokens; a longer prompt is
chunked over steps; a prompt completed gives its first token from its last logits); then one decode step
for every running sequence at the width the scheduler picks, padding rows pointing at the scratch slot.

The pieces around it: serve/config.py (EngineConfig, TokenEvent, QueueFull), serve/sizing.py (how
long a KV slot is and whether the pool fits), serve/compiled_decode.py (the decode step, eager or
compiled per width, timed, warmed up), serve/sampling.py (the next token from a row of logits).

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
from assay.core.numerics import max_abs_diff, rel_error
from assay.serve.engine.config import EngineConfig, QueueFull, TokenEvent
from assay.serve.engine.prefill import BatchPrefill, PrefillJob
from assay.serve.engine.request import EngineRequest, new_request
from assay.serve.engine.sampling import SamplingParams, TokenLogprob, sample_tokens, token_logprobs
from assay.serve.engine.scheduler import decode_width, warm_up_widths
from assay.serve.engine.stats import EagerCheck, EngineStats, EngineTotals, MemoryFacts, StepRecord, now
from assay.serve.runner.compiled_decode import CompiledDecode
from assay.serve.runner.pool import SlotPool
from assay.serve.runner.sizing import check_max_len, check_pool_fits, checkpoint_positions, fitted_slot_len
from assay.serve.runner.weights import KV_REFERENCE_DTYPE, KV_REFERENCE_LENGTHS, ModelAdapter, load_adapter, state_dtype


class Engine(BatchPrefill):
    def __init__(self, adapter: ModelAdapter, config: EngineConfig, tokenizer_dir: str | os.PathLike | None = None):
        config.validate()
        self.config = config
        self.adapter = adapter
        self.device = resolve_device(config.device)
        self.backend = None if config.eager else resolve_backend(config.backend)
        self._tokenizer_dir = tokenizer_dir
        self._tokenizer = None
        dtype = state_dtype(config.state_dtype)
        max_len = config.slot_len()
        check_pool_fits(adapter, config.max_seqs, dtype, max_len, self.device)
        self.pool = SlotPool(adapter.pool_buffers(config.max_seqs + 1, dtype, max_len), config.max_seqs)
        self._max_len = max_len if adapter.uses_max_len() else None

        self._lock = threading.RLock()  # re-entrant: _finish runs both inside step()'s critical section and from _emit
        self._waiting: deque[EngineRequest] = deque()
        self._aborts: set[str] = set()
        self._live_ids: set[str] = set()  # waiting or running
        self._running: dict[str, EngineRequest] = {}
        # Choices 1..n-1 of an admitted request whose prefill has not finished: their slots are taken; they
        # run once the prefill is copied into them.
        self._pending_forks: dict[str, EngineRequest] = {}
        self._prefilling: dict[str, PrefillJob] = {}  # admitted, prompt partly prefilled (engine_prefill.py)
        self._long_waited = False  # a long prompt got no prefill last step: it is offered this one (short_first)
        self._step_count = 0

        self._decoder = CompiledDecode(adapter, self.backend, config.max_seqs, self.device)

        kv = adapter.kv_reference()
        memory = MemoryFacts(
            state_dtype=str(dtype).removeprefix("torch."),
            state_bytes_per_sequence=self.pool.bytes_per_slot(),
            constant_state=not adapter.uses_max_len(),
            max_len=self._max_len,
            kv_reference=kv.note,
            kv_dtype=str(KV_REFERENCE_DTYPE).removeprefix("torch."),
            kv_bytes_per_sequence={n: kv.bytes_per_sequence(n) for n in KV_REFERENCE_LENGTHS},
            pool_bytes=self.pool.total_bytes(),
        )
        self._stats = EngineStats(
            model_type=adapter.model_type, mode=config.mode, buckets=list(config.buckets) if config.buckets else None,
            max_seqs=config.max_seqs, memory=memory, eager_check=EagerCheck() if config.check_eager and not config.eager else None,
        )

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, config: EngineConfig) -> Engine:
        """The adapter of the architecture registry's entry for config.json's model_type; the checkpoint's own tokenizer."""
        config.validate()
        check_max_len(path, config.max_len)  # past the model's positions only where its rope scaling reaches
        device = resolve_device(config.device)
        if config.max_len is not None:
            adapter = load_adapter(path, device, config.max_len, config.dtype)
        else:
            # No --max-len: a slot reaches prompt + new tokens, but not past the positions the model was
            # trained for (its rotary table would be extended silently) nor past what the memory holds.
            adapter = load_adapter(path, device, min(config.slot_len(), checkpoint_positions(path) or config.slot_len()), config.dtype)
            if adapter.uses_max_len():
                config = replace(config, max_len=fitted_slot_len(adapter, config.slot_len(), config.max_seqs, config.state_dtype, device))
        from assay.models.hf_checkpoint import checkpoint_dir

        return cls(adapter, config, tokenizer_dir=checkpoint_dir(path))

    @property
    def tokenizer(self):
        """The checkpoint's Hugging Face tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            if self._tokenizer_dir is None:
                raise AssayError("this engine was built without a checkpoint folder, so it has no tokenizer")
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            # Transformers warns that config.json's model_type (gla) is not one it knows; the tokenizer
            # files are complete, so the warning is noise in a server's log.
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(str(self._tokenizer_dir))
            finally:
                hf_logging.set_verbosity(verbosity)
        return self._tokenizer

    # ---------------------------------------------------------------- compile
    @property
    def compile_stats(self):
        """Graphs compiled by this engine's decode step (warm-up included)."""
        return self._decoder.compile_stats

    def warm_up(self) -> None:
        """Compile every bucket width now (padding rows only: the scratch slot), so serving never waits on the
        compiler. A no-op under --eager and --no-buckets (there, widths compile when first seen)."""
        if self.config.eager or self.config.buckets is None:
            return
        widths = warm_up_widths(self.config.buckets, self.config.max_seqs)
        start = now()
        compiles = self._decoder.warm_up(widths, self.pool.scratch_slot, self.pool.buffers)
        self._stats.warmup_widths = widths
        self._stats.warmup_compiles += compiles
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
            if len(self._waiting) >= config.max_waiting:
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
        return int(self.adapter.args.vocab_size)

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
            rows = self._plan_prefill()
        events += self._run_prefill(rows)
        if self._running:
            events += self._decode_step()
        return events

    def _decode_step(self) -> list[TokenEvent]:
        running = list(self._running.values())
        width = decode_width(len(running), self.config.buckets)
        padding = width - len(running)
        scratch = self.pool.scratch_slot
        tokens = torch.tensor([[r.last_token] for r in running] + [[0]] * padding, dtype=torch.int64, device=self.device)
        slot_ids = torch.tensor([r.slot for r in running] + [scratch] * padding, dtype=torch.int64, device=self.device)
        positions = torch.tensor([r.next_position for r in running] + [0] * padding, dtype=torch.int64, device=self.device)
        reference_rows = None
        if self._stats.eager_check is not None:
            reference_rows = [buffer.index_select(0, slot_ids).clone() for buffer in self.pool.buffers]
        buffers = self.pool.buffers
        if self.config.eager:  # only the positions the rows hold (a compiled step keeps the pool's one shape)
            buffers = self.adapter.live_buffers(buffers, max(r.next_position for r in running) + 1)
        logits, compiled, compile_s, step_s = self._decoder.timed(tokens, slot_ids, positions, buffers)
        self._step_count += 1
        with self._lock:
            self._stats.add_step(StepRecord(self._step_count, width, len(running), compiled, compile_s, step_s))
        real_logits = logits[: len(running)]
        if reference_rows is not None:
            self._check_eager(real_logits, tokens, positions, reference_rows, len(running))
        for request in running:
            request.next_position += 1
        next_tokens = self._sample(real_logits, running)
        logprobs = token_logprobs(real_logits, next_tokens, [request.sampling for request in running])
        return [self._emit(request, token, logprob) for request, token, logprob in zip(running, next_tokens, logprobs)]

    def _check_eager(self, logits, tokens, positions, rows, n_real) -> None:
        # The same inputs through the uncompiled model, on a private copy of the gathered rows (row i <- slot_ids[i]).
        local_ids = torch.arange(tokens.shape[0], dtype=torch.int64, device=self.device)
        with torch.no_grad():
            reference = self.adapter.decode(tokens, local_ids, positions, rows)[:n_real]
        self._stats.eager_check.add(max_abs_diff(logits, reference), rel_error(logits, reference))

    def _sample(self, logits: torch.Tensor, requests: list[EngineRequest]) -> list[int]:
        # logits: [N, vocab] -> one token per request
        return sample_tokens(logits, [request.sampling for request in requests])

    def _emit(self, request: EngineRequest, token: int, logprob: TokenLogprob | None = None) -> TokenEvent:
        event = self._advance(request, token)
        event.logprob = logprob
        return event

    def _advance(self, request: EngineRequest, token: int) -> TokenEvent:
        index = len(request.generated)
        request.generated.append(token)
        request.last_token = token
        self._stats.token(request.request_id, now())
        if token in request.stop_token_ids:
            with self._lock:
                return self._finish(request, "stop", token_id=token, index=index)
        if len(request.generated) >= request.max_tokens:
            with self._lock:
                return self._finish(request, "length", token_id=token, index=index)
        return TokenEvent(request.request_id, token, index, False, None)

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


