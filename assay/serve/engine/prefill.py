"""Batched, chunked prefill, interleaved with decode (as vLLM schedules chunked prefill).

Each engine step runs at most ONE prefill call, before its decode step:
  1. plan: the prompts being prefilled (oldest first), then waiting requests that fit free slots (FIFO), each
     offered its remaining prompt tokens, short prompts first and one long prompt after them (`short_first`,
     EngineConfig.long_prefill_token_threshold); `plan_chunks` picks the rows and how many tokens each gets, so the
     padded batch (rows x the longest chunk) stays within `max_prefill_tokens` and its padding within
     MAX_PADDED_OVER_REAL x the real tokens (a row that would pad more waits for a later step);
  2. one `adapter.prefill_batch` call over the right-padded batch: fresh rows start at position 0, later
     chunks of a long prompt continue from their slot (start_positions > 0). GLA: the chunked form with the
     pad mask; a KV cache: one attention call per layer over the padded batch;
  3. a row whose prompt is now complete samples its first token from its last logits and joins the running
     sequences (n > 1: its slot is copied into the other choices' slots first); the step's decode follows,
     so running sequences get a token every step however long the prompts being prefilled are.

With prompt_logprobs (echo) the call returns the logits at every position and each chunk's prompt entries
are computed as the chunk is prefilled (no [prompt, vocab] logits are kept across steps).

An abort of a request being prefilled frees its slot; when it had other choices still waiting for its
prefill, the first of them takes over (the partial state is copied into its slot) and prefilling goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from assay.core.device import synchronize
from assay.serve.engine.stats import now
from assay.serve.engine.config import TokenEvent
from assay.serve.engine.request import EngineRequest
from assay.serve.engine.sampling import TokenLogprob, prompt_logprobs, token_logprobs

# A batch's padded tokens (rows x longest chunk) may be at most this many times its real tokens: a row that
# would pad more waits for a step whose batch suits it. The oldest row is always taken. Checked row by row
# as the batch grows, so a tighter cap also turns away a short row that later rows would have evened out:
# on 32 prompts of 16-384 tokens (budget 2048) 2.0 pads 31% of the prefilled tokens in 5 calls, 1.5 22% in
# 6, 1.25 15% in 7 (docs/serve.md, "Scheduling").
MAX_PADDED_OVER_REAL = 2.0


@dataclass
class PrefillJob:
    """A request (with its other choices in .forks) whose prompt is partly in its slot."""

    request: EngineRequest
    done: int = 0  # prompt tokens already in the slot
    prompt_entries: list[TokenLogprob] = field(default_factory=list)  # echo: the entries of the chunks so far

    @property
    def remaining(self) -> int:
        return len(self.request.prompt) - self.done


def short_first(prompt_lengths: list[int], long_threshold: int | None, long_waited: bool = True) -> list[int]:
    """Candidate indices (candidates oldest first) in the order they are offered the step's budget: prompts of
    at most long_threshold tokens first, then the oldest longer one alone (vLLM's long_prefill_token_threshold
    with max_long_partial_prefills 1). A 2K-token prompt first in line would otherwise take the whole budget
    step after step while a 100-token request waits behind every chunk of it (bench/serve_ttft.py).

    long_waited False (the long prompt was offered the previous step): while short prompts are waiting the
    long one sits this step out, so the short ones' step is their prefill alone. Sharing it, a short row is
    padded to the long chunk's width and attends over the long row's cached positions, and the step costs a
    whole chunk: measured p99 TTFT 3.5x the alone case, against 3x wanted. It never sits out two steps in a
    row, so under sustained short traffic it still gets every other step. None or 0: FIFO."""
    if not long_threshold:
        return list(range(len(prompt_lengths)))
    short = [i for i, n in enumerate(prompt_lengths) if n <= long_threshold]
    long = [i for i, n in enumerate(prompt_lengths) if n > long_threshold]
    if short and long and not long_waited:
        return short
    return short + long[:1]


def plan_chunks(remaining: list[int], budget: int | None, max_padded_over_real: float | None = None) -> list[int]:
    """Tokens each candidate prefills this step (0: not this step), candidates in priority order.

    The first always gets min(remaining, budget). A later one joins while rows x width (the longest chunk)
    stays <= budget, taking its whole remainder or, when that is longer, as much as the budget leaves per row
    (a chunk: it continues next step); it is skipped when the batch's padding would pass the cap.
    budget None: no limit on tokens (every candidate whole), the padding cap still applies.
    """
    cap_ratio = MAX_PADDED_OVER_REAL if max_padded_over_real is None else max_padded_over_real
    chunks = [0] * len(remaining)
    rows = width = real = 0
    for index, tokens in enumerate(remaining):
        if tokens < 1:
            continue
        if rows == 0:
            chunk = tokens if budget is None else min(tokens, budget)
        else:
            cap = tokens if budget is None else budget // (rows + 1)  # the widest batch one more row allows
            if budget is not None and cap < width:
                break  # no later row fits either: the width only grows
            chunk = min(tokens, cap)
            if (rows + 1) * max(width, chunk) > cap_ratio * (real + chunk):
                continue
        chunks[index] = chunk
        rows, width, real = rows + 1, max(width, chunk), real + chunk
    return chunks


class BatchPrefill:
    """The engine's prefill half (a mixin of Engine): which prompts prefill this step, the one batched call,
    and each completed prompt's first token. Uses the engine's pool, lock, queues and accounting."""

    def _plan_prefill(self) -> list[tuple[PrefillJob, int]]:
        """Called with the lock held: the step's rows (job, tokens this step); waiting requests picked are
        admitted (their slots, and their other choices', allocated)."""
        jobs = list(self._prefilling.values())
        waiting: list[EngineRequest] = []
        slots = self.pool.num_free
        for request in self._waiting:  # FIFO: the first that does not fit the free slots stops the line
            if 1 + len(request.forks) > slots:
                break
            waiting.append(request)
            slots -= 1 + len(request.forks)
        fresh = [PrefillJob(request) for request in waiting]
        lengths = [len(job.request.prompt) for job in jobs + fresh]
        threshold = self.config.long_prefill_token_threshold
        offered = [(jobs + fresh)[i] for i in short_first(lengths, threshold, self._long_waited)]
        chunks = plan_chunks([job.remaining for job in offered], self.config.max_prefill_tokens)
        rows = [(job, chunk) for job, chunk in zip(offered, chunks) if chunk]
        # A long prompt that got nothing this step is offered the next one whatever else waits (short_first).
        self._long_waited = bool(threshold) and any(n > threshold for n in lengths) and not any(
            len(job.request.prompt) > threshold for job, _ in rows)
        admitted = {id(job.request) for job, _ in rows if any(job is new for new in fresh)}
        if admitted:
            self._waiting = type(self._waiting)(r for r in self._waiting if id(r) not in admitted)
        for job in fresh:
            if id(job.request) in admitted:
                self._admit(job)
        return rows

    def _admit(self, job: PrefillJob) -> None:
        request = job.request
        request.slot = self.pool.allocate()
        self._prefilling[request.request_id] = job
        for fork in request.forks:
            fork.slot = self.pool.allocate()
            self._pending_forks[fork.request_id] = fork

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
        """One prefill_batch call over the right-padded rows; the first tokens of the prompts it completes."""
        if not rows:
            return []
        width = max(chunk for _, chunk in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        for row, (job, chunk) in enumerate(rows):
            tokens[row, :chunk] = torch.tensor(job.request.prompt[job.done:job.done + chunk], dtype=torch.int64)
        device = self.device
        slot_ids = torch.tensor([job.request.slot for job, _ in rows], dtype=torch.int64, device=device)
        lengths = torch.tensor([chunk for _, chunk in rows], dtype=torch.int64, device=device)
        starts = torch.tensor([job.done for job, _ in rows], dtype=torch.int64, device=device)
        all_logits = any(job.request.prompt_logprobs is not None for job, _ in rows)
        synchronize(device)
        start = now()
        # Only the positions the rows will hold after this call (the prefill runs uncompiled in every mode): a later
        # chunk of a 2K prompt no longer gathers and attends over its whole slot (bench/serve_ttft.py).
        buffers = self.adapter.live_buffers(self.pool.buffers, max(job.done + chunk for job, chunk in rows))
        with torch.no_grad():
            logits = self.adapter.prefill_batch(tokens.to(device), slot_ids, buffers, lengths=lengths,
                                                start_positions=starts, all_logits=all_logits)
        synchronize(device)
        with self._lock:
            stats = self._stats
            stats.prefill_calls += 1
            stats.prefill_s += now() - start
            stats.prefill_tokens += int(lengths.sum())
            stats.prefill_padded_tokens += len(rows) * width
        events: list[TokenEvent] = []
        for row, (job, chunk) in enumerate(rows):
            request = job.request
            if request.prompt_logprobs is not None:
                entries = prompt_logprobs(logits[row, :chunk], request.prompt[job.done:job.done + chunk + 1], request.prompt_logprobs)
                job.prompt_entries += entries if job.done == 0 else entries[1:]
            job.done += chunk
            if job.remaining:
                continue
            with self._lock:
                del self._prefilling[request.request_id]
                self._running[request.request_id] = request
                self._stats.prefills += 1
            request.next_position = len(request.prompt)
            last = logits[row, chunk - 1] if all_logits else logits[row]
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
        rows = logits[None].expand(len(members), -1)
        tokens = self._sample(rows, members)
        logprobs = token_logprobs(rows, tokens, [m.sampling for m in members])
        events = [self._emit(member, token, logprob) for member, token, logprob in zip(members, tokens, logprobs)]
        if prompt_entries is not None:
            for event in events:
                event.prompt_logprobs = prompt_entries
        return events

    def _slot_holders(self) -> int:
        """Choices holding a slot: running, being prefilled, or waiting for their first choice's prefill."""
        return len(self._running) + len(self._prefilling) + len(self._pending_forks)


__all__ = ["MAX_PADDED_OVER_REAL", "BatchPrefill", "PrefillJob", "plan_chunks", "short_first"]
