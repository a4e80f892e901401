"""The soak's report (bench/serve/soak.py runs it): outcome counts, the targets met or missed, TTFT per
window, the server's memory over time, and the plot.

What memory growth the engine means to keep: its accounting holds the most recent RECENT decode-step
records and finished requests' timings (assay/serve/engine/stats.py), so a server's resident memory grows
with every step and request until those deques are full (about 40 MiB), then stays. The report measures
the bytes of one record of each kind here (tracemalloc) and, from the server's own counters, how much of
the growth after warm-up they explain; the target is on the raw RSS all the same.
"""

from __future__ import annotations

import os
import statistics
import tracemalloc
from pathlib import Path

from assay.core.metrics import percentile
from bench.serve.soak_clients import KINDS

RSS_GROWTH_TARGET, TTFT_RATIO_TARGET, WARMUP_SHARE = 0.05, 1.5, 0.2
HARD_TARGETS = ("no_hang", "no_5xx", "every_answer_whole_or_refused_as_expected", "slots_free_afterwards", "server_clean")


CLASSES = ("answered", "refused_429", "refused_4xx", "disconnected", "failed")


def outcome_class(outcome: str) -> str:
    return outcome if outcome in CLASSES else "refused_4xx" if outcome.startswith("refused_") else "failed"


def record_bytes(count: int = 5000) -> dict[str, float]:
    """Bytes one decode-step record and one finished request's timing take, as the engine keeps them."""
    from assay.serve.engine.stats import RECENT, RequestTiming, StepRecord

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        steps = [StepRecord(i, 4, 3, False, 0.0, i * 1e-3 + 1e-4) for i in range(count)]
        middle = tracemalloc.get_traced_memory()[0]
        timings = [RequestTiming(added=i + 0.5, first_token=i + 0.6, last_token=i + 0.7, tokens=i, finish_reason="length")
                   for i in range(count)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del steps, timings
    return {"step": (middle - before) / count, "request": (after - middle) / count, "recent": RECENT}


def ttft_windows(outcomes: list, seconds: float) -> tuple[list[dict], dict]:
    """p50/p99 TTFT per window, and the flatness comparison: first vs last minute (thirds under 3 minutes)."""
    def stats(start: float, end: float) -> dict:  # the last window also takes requests sent as the run ended
        values = [o.ttft for o in outcomes if o.ttft is not None and start <= o.start and (o.start < end or end >= seconds)]
        return {"start": round(start, 1), "end": round(end, 1), "count": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}

    width = 30.0 if seconds >= 180 else seconds / 6
    windows = [stats(i * width, (i + 1) * width) for i in range(round(seconds / width))]
    edge = 60.0 if seconds >= 180 else seconds / 3
    first, last = stats(0, edge), stats(seconds - edge, seconds)
    ratio = last["p99"] / first["p99"] if first["p99"] and last["p99"] is not None else None
    return windows, {"compared": "first and last minute" if seconds >= 180 else "first and last third", "first": first, "last": last,
                     "ratio": ratio}


def _median(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(values) if values else None


def rss_flatness(samples: list[dict], seconds: float) -> dict:
    """Warm-up is the first 20% of the run; the median RSS of the next 10% against that of the last 10%."""
    warmup = WARMUP_SHARE * seconds
    after = [s for s in samples if warmup <= s["t"] < warmup + 0.1 * seconds]
    end = [s for s in samples if s["t"] >= 0.9 * seconds]
    later = [s["rss_mib"] for s in samples if s["t"] >= warmup]
    if not after or not end:
        return {"warmup_s": warmup, "growth": None}
    baseline, final = _median(after, "rss_mib"), _median(end, "rss_mib")
    result = {"warmup_s": round(warmup, 1), "start_mib": round(samples[0]["rss_mib"], 2), "baseline_mib": round(baseline, 2),
              "end_mib": round(final, 2), "growth": final / baseline - 1, "peak_mib": round(max(later), 2),
              "peak_growth": max(later) / baseline - 1}
    sizes = record_bytes()
    steps = (_median(after, "decode_steps"), _median(end, "decode_steps"))
    done = (_median(after, "finished"), _median(end, "finished"))
    if None not in steps and None not in done:
        # Only records added while the deques were not yet full take new memory.
        new_steps = max(0.0, min(steps[1], sizes["recent"]) - min(steps[0], sizes["recent"]))
        new_done = max(0.0, min(done[1], sizes["recent"]) - min(done[0], sizes["recent"]))
        records = (new_steps * sizes["step"] + new_done * sizes["request"]) / 2**20
        result |= {"engine_records": {"bytes_per_step": round(sizes["step"]), "bytes_per_request": round(sizes["request"]),
                                      "kept": sizes["recent"], "new_steps": new_steps, "new_requests": new_done, "mib": round(records, 2)},
                   "growth_without_engine_records": (final - records) / baseline - 1}
    return result


def summarise(soak, slots: dict, server: dict, args, limits: dict) -> dict:
    outcomes = soak.outcomes
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, {}).setdefault(o.outcome, 0)
        by_kind[o.kind][o.outcome] += 1
    failures = [o.as_dict() for o in outcomes if o.failed]
    windows, ttft = ttft_windows(outcomes, soak.seconds)
    for window in windows:  # outcome classes per window, for the plot
        window["outcomes"] = dict.fromkeys(CLASSES, 0)
        for o in outcomes:
            if window["start"] <= o.start < window["end"] or (window is windows[-1] and o.start >= window["end"]):
                window["outcomes"][outcome_class(o.outcome)] += 1
    rss = rss_flatness(soak.samples, soak.seconds)
    loads = [s["load1"] for s in soak.samples]
    targets = {
        "no_hang": sum(o.outcome == "hang" for o in outcomes) == 0,
        "no_5xx": sum((o.status or 0) >= 500 or o.outcome == "server_error" for o in outcomes) == 0 and not slots["counters"].get(
            'assay_requests_total{outcome="error"}'),
        "every_answer_whole_or_refused_as_expected": not failures,
        "slots_free_afterwards": slots["all_free"],
        "server_clean": server["tracebacks"] == 0 and server["exit_code"] == 0 and not server["key_in_log"] and not server["key_in_metrics"],
        "every_kind_exercised": sorted(by_kind) == sorted(set(KINDS)),
        "bursts_got_429": bool(soak.bursts) and all(b["refused_429"] > 0 for b in soak.bursts),
        "rss_growth_under_5pct": rss["growth"] is not None and rss["growth"] < RSS_GROWTH_TARGET,
        "ttft_p99_last_within_1.5x_first": ttft["ratio"] is not None and ttft["ratio"] <= TTFT_RATIO_TARGET,
    }
    return {
        "config": {"model": args.model, "minutes": args.minutes, "clients": args.clients, "burst_every_s": args.burst_every,
                   "mode": args.backend or "eager", "limits": limits, "seed": args.seed, "request_timeout_s": soak.setup.timeout,
                   "request_deadline_s": soak.setup.deadline},
        "machine": {"cpus": os.cpu_count(), "load1_mean": round(statistics.fmean(loads), 2) if loads else None,
                    "load1_max": max(loads, default=None), "loadavg_start": args.load_start, "loadavg_end": os.getloadavg()},
        "requests": len(outcomes), "by_kind": by_kind,
        "by_outcome": {k: sum(o.outcome == k for o in outcomes) for k in sorted({o.outcome for o in outcomes})},
        "failures": failures[:200], "failure_count": len(failures), "bursts": soak.bursts, "slots_after": slots, "server": server,
        "rss": rss, "ttft": ttft | {"windows": windows},
        "samples": soak.samples,
        "targets": {name: {"met": met, "hard": name in HARD_TARGETS} for name, met in targets.items()},
        "hard_failure": not all(targets[name] for name in HARD_TARGETS),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_ttft, ax_out) = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
    samples, rss = result["samples"], result["rss"]
    ax_rss.plot([s["t"] for s in samples], [s["rss_mib"] for s in samples], label="server RSS")
    records = rss.get("engine_records")
    if records:  # RSS less what the engine's bounded records (decode steps, finished requests) took since the start
        kept, first = records["kept"], samples[0]
        def less(s: dict) -> float:
            steps = min(s["decode_steps"], kept) - min(first["decode_steps"], kept)
            done = min(s["finished"], kept) - min(first["finished"], kept)
            return s["rss_mib"] - (steps * records["bytes_per_step"] + done * records["bytes_per_request"]) / 2**20
        kept_samples = [s for s in samples if s.get("decode_steps") is not None and first.get("decode_steps") is not None]
        ax_rss.plot([s["t"] for s in kept_samples], [less(s) for s in kept_samples], color="tab:green",
                    label="RSS less the engine's bounded records")
    if rss.get("baseline_mib"):
        ax_rss.axvline(rss["warmup_s"], color="grey", linestyle=":", label="end of warm-up")
        ax_rss.axhline(rss["baseline_mib"] * (1 + RSS_GROWTH_TARGET), color="red", linestyle="--", label="baseline + 5%")
    ax_rss.set_ylabel("MiB")
    load = ax_rss.twinx()
    load.plot([s["t"] for s in samples], [s["load1"] for s in samples], color="tab:orange", alpha=0.5, label="load average (1 min)")
    load.set_ylabel("load average")
    ax_rss.legend(loc="upper left", fontsize=8)
    load.legend(loc="lower right", fontsize=8)
    growth = rss.get("growth")
    title = f"server RSS: {growth:+.1%} after warm-up" if growth is not None else "server RSS"
    if rss.get("growth_without_engine_records") is not None:
        title += f" ({rss['growth_without_engine_records']:+.1%} less the engine's bounded records)"
    ax_rss.set_title(title)
    windows = result["ttft"]["windows"]
    mids = [(w["start"] + w["end"]) / 2 for w in windows]
    for q in ("p50", "p99"):
        ax_ttft.plot(mids, [w[q] for w in windows], marker="o", label=f"TTFT {q} (client, streamed)")
    ratio = result["ttft"]["ratio"]
    ax_ttft.set_title(f"TTFT per window; p99 {result['ttft']['compared']}: x{ratio:.2f}" if ratio else "TTFT per window")
    ax_ttft.set_ylabel("seconds")
    ax_ttft.legend(fontsize=8)
    width = windows[0]["end"] - windows[0]["start"] if windows else 10
    bottom = [0] * len(windows)
    for cls in CLASSES:
        counts = [w["outcomes"][cls] for w in windows]
        ax_out.bar(mids, counts, width * 0.9, bottom=bottom, label=cls)
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax_out.set_ylim(0, max(bottom, default=1) * 1.3)  # room for the legend
    ax_out.set_ylabel("requests per window")
    ax_out.set_xlabel("seconds since the soak began")
    ax_out.legend(fontsize=8, ncol=5)
    fig.suptitle(f"assay serve soak: {result['config']['model']}, {result['config']['minutes']} min, {result['requests']} requests, "
                 f"load {result['machine']['load1_mean']} on {result['machine']['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
