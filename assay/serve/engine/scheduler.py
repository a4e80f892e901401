"""The scheduler: what each engine step runs, as one pure function of the queue and the pool,
`schedule(view, config) -> StepPlan`. The engine builds the view, executes the plan and keeps nothing of
the policy itself.

A step runs at most ONE prefill call, then one decode step of every running sequence:
  prefill  waiting requests are admitted first come, first served while their slots (n choices: n slots) are
           free; the prompts being prefilled and those admitted are offered the step's token budget in the
           policy's order (default: short prompts first, then one long one, `short_first`), and `plan_chunks`
           gives each its tokens: the padded batch (rows x the longest chunk) within max_prefill_tokens, its
           padding within MAX_PADDED_OVER_REAL x the real tokens; a prompt longer than the budget is chunked
           over steps (as vLLM schedules chunked prefill);
  decode   every running sequence, padded up to the next bucket width (`decode_width`), or at exactly the
           running count without buckets.

A compiled graph has static shapes (the engine compiles with dynamic=False, as the reference system
did), so every distinct width is a separate compilation. With buckets the set of widths is small and
known in advance, so warm-up compiles all of them and no request ever waits for the compiler; without
(`--no-buckets`) each new running count compiles the first time it is seen, in the middle of serving.

A new policy is a function (QueueView, EngineConfig) -> StepPlan in POLICIES, chosen by
EngineConfig.scheduling; `plan_in_order` does the admission and the chunking for one that only orders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from assay.core.errors import AssayError
from assay.core.values import comma_list

if TYPE_CHECKING:
    from assay.serve.engine.config import EngineConfig


AUTO_BUCKETS = "auto"  # the default bucket set: default_buckets(max_seqs)


def default_buckets(max_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the first power of two >= max_seqs: every running count has a bucket."""
    widths = [1]
    while widths[-1] < max_seqs:
        widths.append(widths[-1] * 2)
    return tuple(widths)


def resolve_buckets(buckets: tuple[int, ...] | str | None, max_seqs: int) -> tuple[int, ...] | None:
    """The bucket set a setting names: "auto" (default_buckets), a list as text ("1,2,4,8"), widths, or None
    (no buckets: each running count is its own width)."""
    if buckets == AUTO_BUCKETS:
        return default_buckets(max_seqs)
    if isinstance(buckets, str):
        return parse_buckets(buckets)
    return None if buckets is None else tuple(buckets)


# A batch's padded tokens (rows x longest chunk) may be at most this many times its real tokens: a row that
# would pad more waits for a step whose batch suits it. The oldest row is always taken. Checked row by row
# as the batch grows, so a tighter cap also turns away a short row that later rows would have evened out:
# on 32 prompts of 16-384 tokens (budget 2048) 2.0 pads 31% of the prefilled tokens in 5 calls, 1.5 22% in
# 6, 1.25 15% in 7 (docs/serve.md, "Scheduling").
MAX_PADDED_OVER_REAL = 2.0


def parse_buckets(text: str) -> tuple[int, ...]:
    """ "1,2,4,8" -> (1, 2, 4, 8): sorted, unique, each a positive integer; AssayError otherwise."""
    widths = comma_list("--buckets", text, int)
    for width in widths:
        if width < 1:
            raise AssayError(f"--buckets {text!r}: widths must be positive, got {width}")
    return tuple(sorted(set(widths)))


def check_buckets(buckets: tuple[int, ...] | None, max_seqs: int) -> None:
    """Every running count 1..max_seqs must fit a bucket: the largest bucket must be >= max_seqs."""
    if buckets is None:
        return
    if not buckets or any(int(width) < 1 for width in buckets):
        raise AssayError(f"buckets {buckets}: expected positive widths")
    if max(buckets) < max_seqs:
        raise AssayError(f"the largest bucket ({max(buckets)}) is below --max-seqs {max_seqs}: add a bucket >= {max_seqs}")


def decode_width(running: int, buckets: tuple[int, ...] | None) -> int:
    """The batch width a decode step with `running` sequences runs at."""
    if running < 1:
        raise ValueError("no running sequence: nothing to decode")
    if buckets is None:
        return running
    for width in sorted(buckets):
        if width >= running:
            return width
    raise ValueError(f"{running} running sequences exceed the largest bucket {max(buckets)}")


def warm_up_widths(buckets: tuple[int, ...] | None, max_seqs: int) -> list[int]:
    """Widths compiled before serving: exactly those a pool of max_seqs can reach (none without buckets)."""
    if buckets is None:
        return []
    return sorted({decode_width(running, buckets) for running in range(1, max_seqs + 1)})


def short_first(prompt_lengths: list[int], long_threshold: int | None, long_waited: bool = True) -> list[int]:
    """Candidate indices (candidates oldest first) in the order they are offered the step's budget: prompts of
    at most long_threshold tokens first, then the oldest longer one alone (vLLM's long_prefill_token_threshold
    with max_long_partial_prefills 1). A 2K-token prompt first in line would otherwise take the whole budget
    step after step while a 100-token request waits behind every chunk of it (bench/serve/ttft.py).

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



@dataclass(frozen=True)
class Candidate:
    """A request as the scheduler sees it: its prompt, how much of it is in its slot, the slots it needs."""

    request_id: str
    prompt_len: int
    done: int = 0  # prompt tokens already prefilled into its slot
    slots: int = 1  # slots it takes when admitted (1 + its other choices); already held once admitted

    @property
    def remaining(self) -> int:
        return self.prompt_len - self.done


@dataclass(frozen=True)
class QueueView:
    """The queue and the pool at the start of a step."""

    prefilling: tuple[Candidate, ...]  # admitted, prompt partly prefilled, oldest first
    waiting: tuple[Candidate, ...]  # not yet admitted, first come first
    free_slots: int
    long_waited: bool = True  # the policy's own state from the previous plan (short_first's turn-taking)


@dataclass(frozen=True)
class PrefillRow:
    """One row of the step's prefill call: `tokens` prompt tokens of `request_id` from position `start`."""

    request_id: str
    start: int
    tokens: int


@dataclass(frozen=True)
class StepPlan:
    """What one step runs: the prefill rows (in batch order), the waiting requests admitted to run them (first
    come first; they take their slots), then a decode of every running row at decode_width(rows)."""

    prefill: tuple[PrefillRow, ...]
    admit: tuple[str, ...]
    buckets: tuple[int, ...] | None
    long_waited: bool = True  # handed back in the next step's QueueView

    def decode_width(self, rows: int) -> int:
        return decode_width(rows, self.buckets)


def admissible(view: QueueView) -> tuple[Candidate, ...]:
    """The waiting requests whose slots are free, first come first: the first that does not fit stops the line."""
    taken, slots = [], view.free_slots
    for candidate in view.waiting:
        if candidate.slots > slots:
            break
        taken.append(candidate)
        slots -= candidate.slots
    return tuple(taken)


def queued_for_a_slot(choices: list[int], free_slots: int) -> int:
    """Of the waiting requests (first come first, each needing a slot per choice), how many the free slots
    cannot take, as admissible takes them: what --max-waiting bounds. Requests that arrive between two steps
    find slots free but not yet taken (the next step admits them): they wait for that step, not for a slot."""
    for index, needed in enumerate(choices):
        if needed > free_slots:
            return len(choices) - index
        free_slots -= needed
    return 0


def plan_in_order(view: QueueView, config: EngineConfig, order: Callable[[list[Candidate]], list[int]],
                  long_waited: bool = True) -> StepPlan:
    """A plan whose prefill offers the candidates (being prefilled, then admissible) in `order` (indices into
    them) and chunks them within the budget; a waiting candidate that gets tokens is admitted."""
    fresh = admissible(view)
    candidates = [*view.prefilling, *fresh]
    offered = [candidates[i] for i in order(candidates)]
    chunks = plan_chunks([c.remaining for c in offered], config.max_prefill_tokens)
    rows = tuple(PrefillRow(c.request_id, c.done, chunk) for c, chunk in zip(offered, chunks) if chunk)
    picked = {row.request_id for row in rows}
    return StepPlan(rows, tuple(c.request_id for c in fresh if c.request_id in picked), config.buckets, long_waited)


def short_first_policy(view: QueueView, config: EngineConfig) -> StepPlan:
    """The default: short prompts first, one long prompt at a time (short_first), chunked within the budget."""
    threshold = config.long_prefill_token_threshold
    plan = plan_in_order(view, config, lambda candidates: short_first([c.prompt_len for c in candidates], threshold, view.long_waited))
    if not threshold:
        return plan
    # A long prompt that got nothing this step is offered the next one whatever else waits (short_first).
    lengths = {c.request_id: c.prompt_len for c in (*view.prefilling, *admissible(view))}
    long_waited = any(n > threshold for n in lengths.values()) and not any(lengths[r.request_id] > threshold for r in plan.prefill)
    return StepPlan(plan.prefill, plan.admit, plan.buckets, long_waited)


# EngineConfig.scheduling names one of these.
POLICIES: dict[str, Callable[[QueueView, EngineConfig], StepPlan]] = {"short-first": short_first_policy}


def schedule(view: QueueView, config: EngineConfig) -> StepPlan:
    """The step's plan under the configured policy."""
    return POLICIES[config.scheduling](view, config)
