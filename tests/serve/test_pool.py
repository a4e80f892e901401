"""The slot pool's bookkeeping and the scheduler's width choice: no model, milliseconds."""

from __future__ import annotations

import pytest
import torch

from assay.core.errors import AssayError
from assay.serve.runner.pool import SlotPool
from assay.serve.engine.scheduler import check_buckets, decode_width, parse_buckets, warm_up_widths


def _pool(max_seqs: int) -> SlotPool:
    return SlotPool([torch.zeros(max_seqs + 1, 2, 3), torch.zeros(max_seqs + 1, 4)], max_seqs)


def test_pool_hands_out_each_slot_once_and_keeps_the_scratch_row_apart():
    pool = _pool(4)
    slots = [pool.allocate() for _ in range(4)]
    assert sorted(slots) == [0, 1, 2, 3]
    assert pool.scratch_slot == 4 and pool.scratch_slot not in slots
    assert pool.num_free == 0 and pool.num_used == 4
    with pytest.raises(RuntimeError, match="no free slot"):
        pool.allocate()
    pool.release(slots[2])
    assert pool.num_free == 1 and pool.allocate() == slots[2]


def test_releasing_a_slot_twice_is_a_bug_not_a_silent_double_free():
    pool = _pool(2)
    slot = pool.allocate()
    pool.release(slot)
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(slot)
    with pytest.raises(RuntimeError):
        pool.release(pool.scratch_slot)


def test_pool_bytes_count_one_row_of_every_buffer():
    pool = _pool(3)
    assert pool.bytes_per_slot() == (2 * 3 + 4) * 4
    assert pool.total_bytes() == 4 * pool.bytes_per_slot()


def test_pool_rejects_buffers_without_the_scratch_row():
    with pytest.raises(ValueError, match="max_seqs \\+ 1"):
        SlotPool([torch.zeros(4, 2)], 4)


def test_decode_width_pads_to_the_next_bucket_or_takes_the_count_exactly():
    buckets = (1, 2, 4, 8)
    assert [decode_width(n, buckets) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [decode_width(n, None) for n in (1, 3, 7)] == [1, 3, 7]
    with pytest.raises(ValueError):
        decode_width(9, buckets)


def test_warm_up_compiles_exactly_the_widths_the_pool_can_reach():
    assert warm_up_widths((1, 2, 4, 8, 16), 5) == [1, 2, 4, 8]
    assert warm_up_widths((1, 2, 4, 8), 4) == [1, 2, 4]
    assert warm_up_widths(None, 64) == []


def test_bad_bucket_lists_are_one_line_errors():
    assert parse_buckets("8, 1,2,2,4") == (1, 2, 4, 8)
    for text in ("", "1,x", "0,2", "-1"):
        with pytest.raises(AssayError, match="--buckets"):
            parse_buckets(text)
    with pytest.raises(AssayError, match="below --max-seqs"):
        check_buckets((1, 2, 4), 8)
