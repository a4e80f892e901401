"""The server's Prometheus metrics, from prometheus_client, one registry per app.

What the HTTP layer alone knows (outcomes, prompt tokens) are counters it increments. The engine's totals
and its pool's occupancy are read at scrape time from engine.totals(), a handful of scalars: a scrape
never copies the engine's per-step or per-request records. TTFT and TPOT are histograms, as vLLM exposes
them (vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds, with vLLM's buckets),
observed on the engine thread as each latency becomes known.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from assay.serve.engine.engine import Engine

# Outcomes counted in assay_requests_total{outcome=...}: the three finish reasons (one per choice: a batch
# of prompts, each with n choices, counts each), and the refusals (one per HTTP request).
OUTCOMES = ("length", "stop", "abort", "rejected_queue_full", "rejected_invalid", "rejected_too_large", "rejected_unauthorized",
            "error")
# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read these the same way.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST


class _EngineCollector:
    """The engine's totals and gauges, read when scraped."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        totals = self.engine.totals()
        yield CounterMetricFamily("assay_generated_tokens", "Tokens the engine generated (every request, aborted ones too).",
                                  value=totals.output_tokens)
        yield CounterMetricFamily("assay_decode_steps", "Decode steps the engine ran.", value=totals.decode_steps)
        compiles = CounterMetricFamily("assay_compiles", "Decode-width compilations: at warm-up, and while serving (a request waited on them).",
                                       labels=["phase"])
        compiles.add_metric(["warmup"], totals.warmup_compiles)
        compiles.add_metric(["serving"], totals.compiles)
        yield compiles
        prefill = CounterMetricFamily("assay_prefill_compiles", "Prefill graph compilations (a compiled engine, a dense KV model): at "
                                      "warm-up, and while serving (a prompt waited on them).", labels=["phase"])
        prefill.add_metric(["warmup"], totals.prefill_warmup_compiles)
        prefill.add_metric(["serving"], totals.prefill_compiles)
        yield prefill
        seconds = CounterMetricFamily("assay_compile_seconds", "Seconds spent compiling: warm-up wall time, and dynamo's compile time while serving.",
                                      labels=["phase"])
        seconds.add_metric(["warmup"], totals.warmup_s)
        seconds.add_metric(["serving"], totals.compile_s)
        yield seconds
        yield GaugeMetricFamily("assay_running_requests", "Requests holding a slot.", value=totals.running)
        yield GaugeMetricFamily("assay_waiting_requests", "Requests queued for a slot.", value=totals.waiting)
        yield GaugeMetricFamily("assay_free_slots", "Slots free in the pool.", value=totals.free_slots)
        yield GaugeMetricFamily("assay_slots", "Slots in the pool (--max-seqs).", value=totals.slots)
        yield GaugeMetricFamily("assay_state_bytes_per_sequence", "Bytes of decoding state one slot holds.", value=totals.state_bytes_per_sequence)


class ServerMetrics:
    """The metrics of one app over one engine; render() is the /metrics body. Without an engine (a Ray Serve
    router, whose engines are elsewhere): what the HTTP layer counts, and TTFT/TPOT left at zero."""

    def __init__(self, engine: Engine | None):
        # No *_created series: vLLM turns them off too; they double every counter's lines for a timestamp.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("assay_requests", "Choices by finish reason, and HTTP requests refused, by outcome.", ["outcome"],
                                registry=self.registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # every outcome is exposed from the start, at 0
        self.prompt_tokens = Counter("assay_prompt_tokens", "Prompt tokens of the requests the engine accepted.", registry=self.registry)
        self.ttft = Histogram("assay_ttft_seconds", "Time to first token: request added -> first token (queueing + prefill).",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("assay_tpot_seconds", "Time per output token after the first, per request.", buckets=TPOT_BUCKETS,
                              registry=self.registry)
        if engine is not None:
            self.registry.register(_EngineCollector(engine))
            engine.observe_latencies(self.ttft.observe, self.tpot.observe)

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def count_prompt_tokens(self, tokens: int) -> None:
        self.prompt_tokens.inc(tokens)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def snapshot(self) -> Snapshot:
        """Every sample now, as plain data (what a Ray Serve replica sends for the sum over replicas)."""
        return [(family.name, family.documentation, family.type, [(s.name, dict(s.labels), s.value) for s in family.samples])
                for family in self.registry.collect()]


# [(family, help, type, [(sample name, labels, value)])]: picklable, a few dozen numbers.
Snapshot = list[tuple[str, str, str, list[tuple[str, dict, float]]]]
# Gauges that describe each replica alike: the sum keeps one value, not their total.
SAME_ON_EVERY_REPLICA = frozenset({"assay_state_bytes_per_sequence"})


class _Merged:
    def __init__(self, snapshots: list[Snapshot], replicas: int):
        self.snapshots = snapshots
        self.replicas = replicas

    def collect(self):
        families: dict[str, tuple[str, str, dict]] = {}
        for snapshot in self.snapshots:
            for name, documentation, kind, samples in snapshot:
                _, _, values = families.setdefault(name, (documentation, kind, {}))
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    combine = max if name in SAME_ON_EVERY_REPLICA else (lambda a, b: a + b)
                    values[key] = combine(values[key], value) if key in values else value
        for name, (documentation, kind, values) in families.items():
            metric = Metric(name, documentation, kind)
            for (sample, labels), value in values.items():
                metric.add_sample(sample, dict(labels), value)
            yield metric
        yield GaugeMetricFamily("assay_replicas", "Replicas whose metrics are summed here (Ray Serve).", value=self.replicas)


def render_sum(snapshots: list[Snapshot], replicas: int | None = None) -> bytes:
    """The Prometheus text of several servers' snapshots summed: counters, histograms and pool gauges add up.
    assay_replicas: `replicas` (default: the number of snapshots)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(snapshots, len(snapshots) if replicas is None else replicas))
    return prometheus_client.generate_latest(registry)
