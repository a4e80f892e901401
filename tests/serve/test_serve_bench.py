"""`assay serve-bench` end to end on the tiny GLA, its arrival schedules, and its bad-flag errors."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from assay.core.errors import AssayError
from assay.serve.bench import ServeBenchRequest, arrival_times, make_prompts, run_serve_bench


@pytest.mark.slow
def test_serve_bench_cli_compares_buckets_and_none_and_writes_json_and_png(zoo_dir, tmp_path, assay_cli):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    result = assay_cli(
        "serve-bench", "--model", str(zoo_dir / "gla"), "--arrivals", "poisson", "--rate", "200", "--requests", "6",
        "--prompt-tokens", "8,24", "--max-tokens", "4", "--modes", "buckets,none", "--buckets", "1,2,4", "--max-seqs", "4",
        "--backend", "aot_eager", "--out", str(out), "--plot", str(plot), "--json",
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert json.loads(out.read_text()) == printed
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = printed["runs"]
    assert [(r["mode"], r["prompt_tokens"]) for r in runs] == [("buckets", 8), ("none", 8), ("buckets", 24), ("none", 24)]
    for run in runs:
        stats = run["stats"]
        assert run["requests_finished"] == run["requests_sent"] == 6 and not run["timed_out"]
        assert stats["output_tokens"] == 6 * 4 and stats["finished"] == {"length": 6}
        assert stats["ttft_s"]["p50"] <= stats["ttft_s"]["p99"]
        if run["mode"] == "buckets":
            # Warm-up compiled every width; serving compiled nothing.
            assert stats["warmup_compiles"] == 3 and stats["compiles"] == 0 and stats["compile_share"] == 0
        else:
            assert stats["warmup_compiles"] == 0 and stats["compiles"] >= 1 and stats["compile_share"] > 0
            assert len(stats["compiled_steps"]) == stats["compiles"]


def test_fixed_batches_run_one_wave_per_concurrency_at_that_width(zoo_dir):
    request = ServeBenchRequest(
        model=str(zoo_dir / "gla"), arrivals="fixed", concurrency=(1, 3), requests=3, prompt_tokens=(12,), max_tokens=5,
        modes=("eager",), buckets=(1, 2, 4), max_seqs=4,
    )
    result = run_serve_bench(request, progress=False)
    one, three = result.runs
    assert (one.concurrency, three.concurrency) == (1, 3)
    assert one.stats["widths"] == {"1": 3 * 4}  # three waves of one sequence, 4 decode steps each
    assert three.stats["widths"] == {"4": 4}  # one wave of three, padded to the bucket of 4
    assert one.requests_finished == three.requests_finished == 3


def test_poisson_gaps_average_one_over_the_rate_and_bursts_arrive_together():
    request = ServeBenchRequest(model="-", arrivals="poisson", rate=20.0, requests=4000)
    times = arrival_times(request, random.Random(0))
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    # The mean of 4000 exponential gaps has a relative standard error of 1/sqrt(4000) = 1.6%: 6% is ~4 sigma.
    assert statistics.fmean(gaps) == pytest.approx(1 / 20.0, rel=0.06)
    burst = ServeBenchRequest(model="-", arrivals="burst", burst_size=3, burst_interval_s=2.0, requests=7)
    assert arrival_times(burst, random.Random(0)) == [0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 4.0]


def test_prompts_are_corpus_windows_of_the_requested_length():
    corpus = list(range(100))
    prompts = make_prompts(corpus, 30, 5, random.Random(1))
    assert all(len(p) == 30 and p == list(range(p[0], p[0] + 30)) for p in prompts)
    assert all(len(p) == 250 for p in make_prompts(corpus, 250, 2, random.Random(1)))  # longer than the corpus


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--arrivals", "weird"], "--arrivals 'weird'"),
        (["--prompt-tokens", "2k"], "--prompt-tokens '2k'"),
        (["--modes", "fast"], "--modes"),
        (["--buckets", "0,2"], "--buckets"),
        (["--rate", "0"], "--rate"),
    ],
)
def test_bad_flags_exit_2_with_one_line(zoo_dir, assay_cli, flags, message):
    result = assay_cli("serve-bench", "--model", str(zoo_dir / "gla"), *flags)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_a_folder_without_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(AssayError, match="no config.json"):
        run_serve_bench(ServeBenchRequest(model=str(tmp_path), modes=("eager",)), progress=False)
