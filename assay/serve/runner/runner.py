"""The model step over the slot pool: one batched prefill call into slots, one decode step of a batch of slots
at a given width (padding rows on the scratch slot), each timed. The engine decides what runs; this runs it.

    runner = ModelRunner(slot_model, max_seqs=8, pool_dtype=torch.float32, max_len=64, device=cpu, backend=None)
    result = runner.prefill([PrefillInput(tokens=[5, 6, 7], slot=0, start=0)], all_logits=False)
    result = runner.decode([DecodeInput(token=9, slot=0, position=3)], width=2)   # one padding row
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter as now

import torch

from assay.core.device import synchronize
from assay.core.errors import AssayError
from assay.core.numerics import max_abs_diff, rel_error
from assay.models.slots import SlotModel
from assay.serve.runner.compiled_decode import CompiledDecode
from assay.serve.runner.compiled_prefill import MIN_LENGTH, CompiledPrefill
from assay.serve.runner.pool import SlotPool
from assay.serve.runner.quantize import quantize_slot_model
from assay.serve.runner.sizing import check_pool_fits


@dataclass(frozen=True)
class PrefillInput:
    """One row of a prefill call: prompt tokens to write into `slot` from position `start` (0: a fresh sequence)."""

    tokens: list[int]
    slot: int
    start: int


@dataclass(frozen=True)
class DecodeInput:
    """One running sequence in a decode step: the token it feeds, its slot, the token's position."""

    token: int
    slot: int
    position: int


@dataclass(frozen=True)
class PrefillResult:
    logits: torch.Tensor  # [rows, vocab] at each row's last token, or [rows, T, vocab] with all_logits
    seconds: float
    tokens: int  # real prompt tokens
    padded_tokens: int  # rows x the longest chunk
    compiled_call: bool = False  # the call ran the compiled prefill (compiled_prefill.py)
    compiled: bool = False  # this call compiled a new prefill graph
    compile_s: float = 0.0


@dataclass(frozen=True)
class DecodeResult:
    logits: torch.Tensor  # [rows, vocab]: the real rows only
    compiled: bool  # this call compiled a new graph
    compile_s: float
    step_s: float
    eager_diff: tuple[float, float] | None = None  # with check_eager: (max abs, rel. error) against the eager model


class ModelRunner:
    """A slot model, its pool (max_seqs slots + the scratch slot) and its decode step, eager or compiled."""

    def __init__(self, slot_model: SlotModel, max_seqs: int, pool_dtype: torch.dtype, max_len: int, device: torch.device,
                 backend: str | None, check_eager: bool = False, decode_gemm: str = "auto", quantize: str | None = None,
                 compile_prefill: bool = False):
        if quantize is not None:  # before the pool is sized and the decode step traced
            quantize_slot_model(slot_model, quantize, device)
        self.slot_model = slot_model
        self.device = device
        self.eager = backend is None
        check_pool_fits(slot_model, max_seqs, pool_dtype, max_len, device)
        self.pool = SlotPool(slot_model.pool_buffers(max_seqs + 1, pool_dtype, max_len), max_seqs)
        self.decoder = CompiledDecode(slot_model, backend, max_seqs, device, decode_gemm)
        # compile_prefill: a compiled engine compiles the prefill too, where the slot model's prefill traces whole.
        compiled = compile_prefill and not self.eager and slot_model.compiles_prefill
        self.prefiller = CompiledPrefill(slot_model, backend, device) if compiled else None
        self.max_len = max_len
        self.check_eager = check_eager and not self.eager

    def warm_up(self, widths: list[int]) -> int:
        """Compile each width now on padding rows only; the number of graphs compiled."""
        return self.decoder.warm_up(widths, self.pool.scratch_slot, self.pool.buffers)

    def warm_up_prefill(self) -> int:
        """Compile the prefill's graphs now on padding rows only (none for an eager or uncompiled prefill)."""
        return 0 if self.prefiller is None else self.prefiller.warm_up(self.pool.scratch_slot, self.pool.buffers, self.max_len)

    def prefill(self, rows: list[PrefillInput], all_logits: bool) -> PrefillResult:
        """One prefill_batch call over the right-padded rows: compiled where the runner has a compiled prefill
        (not for all_logits: prompt_logprobs' calls stay eager), eager otherwise."""
        if self.prefiller is not None and not all_logits:
            return self._compiled_prefill(rows)
        width = max(len(row.tokens) for row in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        for index, row in enumerate(rows):
            tokens[index, :len(row.tokens)] = torch.tensor(row.tokens, dtype=torch.int64)
        device = self.device
        slot_ids = torch.tensor([row.slot for row in rows], dtype=torch.int64, device=device)
        lengths = torch.tensor([len(row.tokens) for row in rows], dtype=torch.int64, device=device)
        starts = torch.tensor([row.start for row in rows], dtype=torch.int64, device=device)
        synchronize(device)
        start = now()
        # Only the positions the rows will hold after this call (an eager prefill; a compiled one reads the pool): a later
        # chunk of a 2K prompt no longer gathers and attends over its whole slot (bench/serve/ttft.py).
        buffers = self.slot_model.live_buffers(self.pool.buffers, max(row.start + len(row.tokens) for row in rows))
        with torch.no_grad():
            logits = self.slot_model.prefill_batch(tokens.to(device), slot_ids, buffers, lengths=lengths,
                                                start_positions=starts, all_logits=all_logits)
        synchronize(device)
        return PrefillResult(logits, now() - start, int(lengths.sum()), len(rows) * width)

    def _compiled_prefill(self, rows: list[PrefillInput]) -> PrefillResult:
        # The compiled graph reads the pool whole and never checks a row on the host: the checks happen here.
        lengths_list = [len(row.tokens) for row in rows]
        end = max(row.start + length for row, length in zip(rows, lengths_list))
        if min(lengths_list) < 1 or end > self.max_len or min(row.start for row in rows) < 0:
            raise AssayError(f"prefill rows need 1 token or more, start positions >= 0 and an end within the slot's "
                             f"{self.max_len} positions (here: lengths {min(lengths_list)}..{max(lengths_list)}, end {end})")
        width = max(MIN_LENGTH, *lengths_list)
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        for index, row in enumerate(rows):
            tokens[index, :len(row.tokens)] = torch.tensor(row.tokens, dtype=torch.int64)
        device = self.device
        slot_ids = torch.tensor([row.slot for row in rows], dtype=torch.int64, device=device)
        lengths = torch.tensor(lengths_list, dtype=torch.int64, device=device)
        continuing = any(row.start > 0 for row in rows)
        starts = torch.tensor([row.start for row in rows], dtype=torch.int64, device=device) if continuing else None
        logits, compiled, compile_s, seconds = self.prefiller.timed(tokens.to(device), slot_ids, lengths, starts, self.pool.buffers)
        return PrefillResult(logits, seconds, sum(lengths_list), len(rows) * width, True, compiled, compile_s)

    def decode(self, rows: list[DecodeInput], width: int) -> DecodeResult:
        """One decode step of the rows padded to `width` with rows on the scratch slot (they touch no real slot)."""
        padding = width - len(rows)
        scratch = self.pool.scratch_slot
        device = self.device
        tokens = torch.tensor([[row.token] for row in rows] + [[0]] * padding, dtype=torch.int64, device=device)
        slot_ids = torch.tensor([row.slot for row in rows] + [scratch] * padding, dtype=torch.int64, device=device)
        positions = torch.tensor([row.position for row in rows] + [0] * padding, dtype=torch.int64, device=device)
        reference_rows = None
        if self.check_eager:
            reference_rows = [buffer.index_select(0, slot_ids).clone() for buffer in self.pool.buffers]
        buffers = self.pool.buffers
        if self.eager:  # only the positions the rows hold (a compiled step keeps the pool's one shape)
            buffers = self.slot_model.live_buffers(buffers, max(row.position for row in rows) + 1)
        logits, compiled, compile_s, step_s = self.decoder.timed(tokens, slot_ids, positions, buffers)
        logits = logits[: len(rows)]
        eager_diff = None
        if reference_rows is not None:
            # The same inputs through the uncompiled model, on a private copy of the gathered rows (row i <- slot_ids[i]).
            local_ids = torch.arange(width, dtype=torch.int64, device=device)
            with torch.no_grad():
                reference = self.slot_model.decode(tokens, local_ids, positions, reference_rows)[: len(rows)]
            eager_diff = (max_abs_diff(logits, reference), rel_error(logits, reference))
        return DecodeResult(logits, compiled, compile_s, step_s, eager_diff)
