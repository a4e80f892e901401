"""The prefill call under a compiled engine with --compile-prefill: slot_model.prefill_batch compiled for every batch shape.

A decode step has one shape per width, so compiled decode keeps one static graph per width. A prefill call
has a number of rows and a chunk length that both vary with the queue, so a graph per (rows, length) pair
would be dozens of compiles; instead the rows and the length are dynamic dimensions (mark_dynamic, as
vLLM compiles its model once over a symbolic token count) and four graphs serve every call:

  one row, or two and more (dynamo specialises a dimension of size 1)
  x fresh rows only (start_positions None: in-chunk causal attention), or rows that continue a sequence
    (a later chunk of a chunked prefill: each row also attends to its slot's cached positions)

warm_up compiles the four on the scratch slot before serving, so no prompt waits on the compiler. A chunk is
padded to two positions at least (a dimension of size 1 would be a fifth graph); the cache is the pool's own
(an uncompiled prefill reads only the positions its rows can hold: compiled, the pool keeps one shape).
Prefill calls that return the logits at every position (prompt_logprobs) stay eager: rare, and a graph each.
Measured on SmolLM2-135M-Instruct, 2 threads, inductor: the compiled call takes 0.72-0.84x the eager one's time
at 1-32 rows of 128-256 tokens; compiling the four graphs took 240-270 s cold on 2 cores (two decode widths:
88 s), which is why it is opt-in (docs/serve.md, "Compiled prefill").

Which slot models: those whose prefill_batch traces without a graph break (SlotModel.compiles_prefill).
"""

from __future__ import annotations

import logging

import torch

from assay.core.compiling import CompileStats, compile_fn, fresh_function, timed_call
from assay.models.slots import SlotModel

log = logging.getLogger("assay.serve")

MIN_LENGTH = 2  # a chunk of one token is padded to two: one graph for every length
WARM_UP_LONG = 256  # the warm-up's second length (see CompiledPrefill.warm_up)


def _prefill_call(slot_model: SlotModel, tokens, slot_ids, buffers, lengths, starts):
    # tokens: [B, T] right-padded; slot_ids, lengths: [B]; starts: [B] or None (fresh rows) -> logits [B, vocab]
    return slot_model.prefill_batch(tokens, slot_ids, buffers, lengths=lengths, start_positions=starts)


class CompiledPrefill:
    """slot_model.prefill_batch compiled with `backend` over dynamic rows and length; its compiles counted in
    compile_stats."""

    def __init__(self, slot_model: SlotModel, backend: str, device: torch.device):
        self.slot_model = slot_model
        self.device = device
        self.compile_stats = CompileStats()
        # dynamic=None with the rows and the length marked: those two are symbolic, every other size static.
        self._prefill = compile_fn(fresh_function(_prefill_call), backend, self.compile_stats, dynamic=None)

    def timed(self, tokens, slot_ids, lengths, starts, buffers) -> tuple[torch.Tensor, bool, float, float]:
        """(logits [B, vocab], compiled?, compile_s, seconds) of one call. tokens [B, T] with T >= MIN_LENGTH;
        starts None when every row is fresh."""
        rows = tokens.shape[0]
        torch._dynamo.mark_dynamic(tokens, 1)
        if rows > 1:
            for tensor in (tokens, slot_ids, lengths) + (() if starts is None else (starts,)):
                torch._dynamo.mark_dynamic(tensor, 0)

        def call():
            return self._prefill(self.slot_model, tokens, slot_ids, buffers, lengths, starts)

        return timed_call(call, self.compile_stats, self.device)

    def warm_up(self, scratch_slot: int, buffers, max_len: int) -> int:
        """Compile the four graphs now on padding rows (the scratch slot); the number of graphs compiled. Each kind
        runs at two lengths, MIN_LENGTH and min(max_len, WARM_UP_LONG): a model that branches on its token count
        (--quantize int8 dequantizes from 128 tokens on) gets the graph of each branch now, not at a user's prompt."""
        graphs_before = self.compile_stats.graphs
        shapes = [(rows, continuing) for continuing in (False, True) for rows in (1, 2)]
        for index, (rows, continuing) in enumerate(shapes, 1):
            kind = f"{'one row' if rows == 1 else 'two rows and more'}, {'continuing' if continuing else 'fresh'}"
            log.info(f"compiling prefill ({index}/{len(shapes)}: {kind}) ...")
            for length in sorted({MIN_LENGTH, max(MIN_LENGTH, min(max_len, WARM_UP_LONG))}):
                tokens = torch.zeros(rows, length, dtype=torch.int64, device=self.device)
                slot_ids = torch.full((rows,), scratch_slot, dtype=torch.int64, device=self.device)
                lengths = torch.full((rows,), length, dtype=torch.int64, device=self.device)
                starts = torch.zeros(rows, dtype=torch.int64, device=self.device) if continuing else None
                self.timed(tokens, slot_ids, lengths, starts, buffers)
        return self.compile_stats.graphs - graphs_before


__all__ = ["CompiledPrefill", "MIN_LENGTH"]
