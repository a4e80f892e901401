"""The serving soak (bench/serve/soak.py) for 30 seconds: the real `assay serve` in a subprocess under
every client kind at once, bursts over its queue included.

30 s, not the bench's 10 minutes: the suite must stay under 30 minutes on 2 cores, and 30 s already sends
every kind many times over (about 2,000 requests on this machine, 3 bursts, one every 10 s). The hard targets are
asserted exactly; the flatness ones loosely (see test_flatness_within_loose_bounds).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = {"completion", "completion_stream", "chat", "chat_stream", "sampling", "disconnect_stream", "disconnect_plain", "partial_body",
         "malformed_json", "unknown_field", "bad_value", "invalid_utf8", "wrong_key", "over_limit", "burst_member"}


@pytest.fixture(scope="module")
def soak(zoo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "serve" / "soak.py"), "--minutes", "0.5", "--zoo", str(zoo_dir),
                                "--burst-every", "10", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO,
                               check=False)
    result = json.loads(out.read_text()) if out.exists() else None
    return completed, result, out


@pytest.mark.slow
def test_soak_no_hang_no_5xx_every_answer_whole_and_exit_0(soak):
    completed, result, _ = soak
    assert result is not None, completed.stdout + completed.stderr
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert not result["hard_failure"] and result["failure_count"] == 0, result["failures"][:10]
    assert "hang" not in result["by_outcome"] and not any(o.startswith("unexpected") for o in result["by_outcome"])
    assert all(not k.startswith(("server_error", "transport_error", "incomplete")) for k in result["by_outcome"])
    assert result["slots_after"]["counters"]['assay_requests_total{outcome="error"}'] == 0
    assert result["server"]["exit_code"] == 0 and result["server"]["tracebacks"] == 0, result["server"]["stderr_tail"]
    assert result["server"]["health_after"] == 200
    assert not result["server"]["key_in_log"] and not result["server"]["key_in_metrics"]


@pytest.mark.slow
def test_soak_leaves_every_slot_free(soak):
    slots = soak[1]["slots_after"]
    assert slots["all_free"] and slots["free"] == slots["slots"] == 4, slots
    assert slots["running"] == 0 and slots["waiting"] == 0


@pytest.mark.slow
def test_soak_exercised_every_client_kind_with_the_outcomes_it_expects(soak):
    by_kind = soak[1]["by_kind"]
    assert set(by_kind) == KINDS
    for kind in ("completion", "completion_stream", "chat", "chat_stream", "sampling"):
        assert by_kind[kind].get("answered", 0) > 0, (kind, by_kind[kind])
    assert by_kind["disconnect_stream"].get("disconnected", 0) > 0 and by_kind["disconnect_plain"].get("disconnected", 0) > 0
    for kind in ("malformed_json", "unknown_field", "invalid_utf8"):
        assert set(by_kind[kind]) == {"refused_400"}, (kind, by_kind[kind])
    assert set(by_kind["bad_value"]) == {"refused_422"}
    assert set(by_kind["wrong_key"]) == {"refused_401"}
    assert soak[1]["slots_after"]["counters"]['assay_requests_total{outcome="rejected_unauthorized"}'] == by_kind["wrong_key"]["refused_401"]
    assert set(by_kind["over_limit"]) <= {"refused_400", "refused_413"} and by_kind["over_limit"]
    # Bursts over the queue: each one got some 429s and some answers, and the server counted the same 429s
    # the clients saw (the raw-socket clients never read their answer, so the server's count may be larger).
    bursts = soak[1]["bursts"]
    assert len(bursts) >= 2 and all(b["refused_429"] > 0 and b["answered"] > 0 for b in bursts), bursts
    seen_429 = soak[1]["by_outcome"]["refused_429"]
    assert soak[1]["slots_after"]["counters"]['assay_requests_total{outcome="rejected_queue_full"}'] >= seen_429


@pytest.mark.slow
def test_soak_writes_json_and_plot(soak):
    # About one sample a second (RSS and a /metrics scrape): at least one every two seconds of the 30.
    _, result, out = soak
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result["samples"]) >= 15 and all(s["rss_mib"] > 0 for s in result["samples"])
    assert result["machine"]["loadavg_start"] and result["ttft"]["windows"]
    assert set(result["targets"]) >= {"rss_growth_under_5pct", "ttft_p99_last_within_1.5x_first", "slots_free_afterwards"}


@pytest.mark.slow
def test_flatness_within_loose_bounds(soak):
    # Loose on purpose: in 30 s on a shared 2-core machine (load 4-6 while the suite runs) warm-up is the
    # first 6 s, and a third holds ~60 streamed requests, so its p99 is the one or two slowest, which a
    # single pause of another process moves several-fold. These bounds catch a leak or a server that
    # slows down step after step (RSS +25%, TTFT x10), not noise; the strict 5% and 1.5x targets are
    # the 10-minute bench's (docs/serve.md "soak").
    rss, ttft = soak[1]["rss"], soak[1]["ttft"]
    assert rss["growth"] is not None and rss["growth"] < 0.25, rss
    assert ttft["first"]["count"] >= 20 and ttft["last"]["count"] >= 20, ttft
    assert ttft["ratio"] is not None and ttft["ratio"] < 10, ttft
