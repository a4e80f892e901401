"""The scheduler as a pure function (serve/engine/scheduler.py): a queue and a pool in, a step plan out; and a
policy added in the scheduler's table and chosen by EngineConfig.scheduling, which the engine then follows."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from assay.core.errors import AssayError
from assay.models import registry
from assay.serve import Engine, EngineConfig
from assay.serve.engine import scheduler
from assay.serve.engine.scheduler import Candidate, PrefillRow, QueueView, plan_in_order, schedule


def _view(waiting=(), prefilling=(), free_slots=8, long_waited=True) -> QueueView:
    return QueueView(tuple(prefilling), tuple(waiting), free_slots, long_waited)


def test_waiting_requests_are_admitted_first_come_while_their_slots_are_free():
    # b needs 3 slots (n = 3) and only 2 are left after a: b stops the line, so c waits behind it.
    view = _view([Candidate("a", 10), Candidate("b", 10, slots=3), Candidate("c", 10)], free_slots=3)
    plan = schedule(view, EngineConfig(max_seqs=8))
    assert plan.admit == ("a",)
    assert plan.prefill == (PrefillRow("a", 0, 10),)


def test_a_long_prompt_is_chunked_within_the_budget_and_continues_from_where_it_stopped():
    config = EngineConfig(max_seqs=8, max_prefill_tokens=16, long_prefill_token_threshold=None)
    first = schedule(_view([Candidate("long", 40)]), config)
    assert first.prefill == (PrefillRow("long", 0, 16),) and first.admit == ("long",)
    later = schedule(_view(prefilling=[Candidate("long", 40, done=32, slots=0)]), config)
    assert later.prefill == (PrefillRow("long", 32, 8),) and later.admit == ()


def test_short_prompts_go_before_a_long_one_and_it_sits_out_at_most_one_step():
    config = EngineConfig(max_seqs=8, max_prefill_tokens=64, long_prefill_token_threshold=32)
    view = _view([Candidate("long", 100), Candidate("short", 8)], long_waited=False)
    plan = schedule(view, config)
    assert [row.request_id for row in plan.prefill] == ["short"]
    assert plan.long_waited  # the long prompt got nothing: it is offered the next step whatever waits
    plan = schedule(_view([Candidate("long", 100), Candidate("short2", 8)], long_waited=plan.long_waited), config)
    assert [row.request_id for row in plan.prefill] == ["short2", "long"]


def test_the_plan_decodes_at_the_bucket_width():
    plan = schedule(_view(), EngineConfig(max_seqs=8, buckets=(1, 2, 4, 8)))
    assert plan.prefill == () and [plan.decode_width(n) for n in (1, 3, 5)] == [1, 4, 8]
    assert schedule(_view(), EngineConfig(max_seqs=8, buckets=None)).decode_width(5) == 5


def test_default_buckets_are_powers_of_two_up_to_max_seqs():
    assert EngineConfig(max_seqs=8).buckets == (1, 2, 4, 8)
    assert EngineConfig(max_seqs=100).buckets == (1, 2, 4, 8, 16, 32, 64, 128)
    assert EngineConfig(max_seqs=8, buckets="8,1,2,4").buckets == (1, 2, 4, 8)


def test_an_unknown_policy_is_refused():
    with pytest.raises(AssayError, match="scheduling 'nope': expected one of short-first"):
        EngineConfig(scheduling="nope").validate()


def _newest_first(view: QueueView, config: EngineConfig):
    # A toy policy: the newest candidate first (the default offers equal prompts oldest first).
    return plan_in_order(view, config, lambda candidates: list(reversed(range(len(candidates)))))


def _tiny_gla():
    spec = registry.get("gla")
    args = replace(spec.flavours["tiny"], max_seq_len=64)
    return spec.wrap_slot_model(spec.build(args, "cpu", torch.float32, seed=0).eval(), args)


@pytest.mark.parametrize("policy, order", [("short-first", ["a", "b", "c"]), ("newest-first", ["c", "b", "a"])])
def test_the_engine_follows_a_policy_added_to_the_scheduler(monkeypatch, policy, order):
    # The whole policy is one entry in the scheduler's table plus the config field that names it.
    monkeypatch.setitem(scheduler.POLICIES, "newest-first", _newest_first)
    # A budget of one prompt per step: the order the prompts get their first token is the order they are offered.
    engine = Engine(_tiny_gla(), EngineConfig(max_seqs=4, buckets=(1, 2, 4), eager=True, max_prefill_tokens=4, scheduling=policy))
    for request_id in ("a", "b", "c"):
        engine.add_request(request_id, [5, 6, 7, 8], max_tokens=3)
    first_tokens = []
    while engine.has_unfinished():
        first_tokens += [event.request_id for event in engine.step() if event.index == 0]
    assert first_tokens == order
