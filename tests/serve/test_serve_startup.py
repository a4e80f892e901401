"""`assay serve`'s start-up: defaults that fit a CPU (eager, the compiled bucket mode one flag away), progress
lines on stderr before anything long (the load, the pool's size before it is allocated, each width as it
compiles), and a pool that does not fit refused in one line naming the flag."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from assay.core.errors import AssayError
from assay.serve.engine.scheduler import warm_up_widths
from assay.serve.launch import decode_mode
from assay.serve.settings import ServeRequest, engine_config

ALL_WIDTHS = "1, 2, 4, 8, 16, 32, 64"


@pytest.mark.parametrize("settings, eager", [
    ({}, True),                                       # a plain `assay serve` on a CPU
    ({"compile": True}, False),                       # the compiled bucket mode, one flag away
    ({"backend": "aot_eager"}, False),                # a setting only a compiled decode reads asks for it
    ({"buckets": "1,2,4,8,16,32,64"}, False),
    ({"no_buckets": True}, False),
    ({"eager": True, "backend": "aot_eager"}, True),  # --eager still wins
    ({"device": "cuda"}, False),                      # an accelerator compiles by default
])
def test_a_cpu_decodes_eager_by_default_and_compiles_when_asked(settings, eager):
    request = ServeRequest(model="unused", **settings)
    assert request.eager is eager
    if settings.get("device") != "cuda":
        config = engine_config(request)
        assert config.eager is eager and config.max_seqs == 64


def test_compile_means_every_power_of_two_width_up_to_max_seqs():
    config = engine_config(ServeRequest(model="unused", compile=True))
    assert warm_up_widths(config.buckets, config.max_seqs) == [1, 2, 4, 8, 16, 32, 64]
    assert decode_mode(config) == f"decode compiled with inductor at 7 widths ({ALL_WIDTHS}) before serving"
    assert decode_mode(engine_config(ServeRequest(model="unused"))) == "eager decode"


def test_eager_and_compile_exclude_each_other():
    with pytest.raises(AssayError, match="--eager and --compile exclude each other"):
        ServeRequest(model="unused", eager=True, compile=True)


def _start(folder: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """`assay serve` as a process and its URL line (stdout), read once it is ready."""
    process = subprocess.Popen([sys.executable, "-m", "assay", "serve", "--model", str(folder), "--port", "0", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    return process, process.stdout.readline()


def _stop(process: subprocess.Popen) -> tuple[str, str]:
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("flags, compiled", [((), None), (("--backend", "aot_eager", "--max-seqs", "4"), [1, 2, 4])],
                         ids=["default-eager", "compiled"])
def test_assay_serve_says_what_it_loads_the_pool_and_each_width_before_it_is_ready(zoo_dir, flags, compiled):
    process, ready = _start(zoo_dir / "gla", *flags)
    try:
        assert "http://" in ready, ready
        # Answering: uvicorn has its signal handlers (a SIGINT before them would end the process with 130).
        assert httpx.get(f"{ready.rsplit(' ', 1)[-1].strip()}/health", timeout=60).status_code == 200
    finally:
        stdout, stderr = _stop(process)
    lines = stderr.splitlines()
    assert "\r" not in stderr, "not a terminal: plain lines"
    # The first line comes before torch is imported and the weights are loaded: what, in which dtype, where, how.
    mode = "eager decode" if compiled is None else "decode compiled with aot_eager at 3 widths (1, 2, 4) before serving"
    assert lines[0] == f"loading {zoo_dir / 'gla'} (gla): float32 weights on cpu, {mode}"
    slots = 64 if compiled is None else 4
    pool = [i for i, line in enumerate(lines) if line.startswith(f"slot pool: {slots} slots + 1 scratch, fixed state in float32: ")]
    assert len(pool) == 1 and "GiB free" in lines[pool[0]], lines
    widths = [line for line in lines if line.startswith("compiling decode width")]
    if compiled is None:
        assert widths == []
        assert f"eager; --compile for the decode compiled with inductor at 7 widths ({ALL_WIDTHS}) before serving) at http://" in ready
    else:
        assert widths == [f"compiling decode width {w} ({i}/3) ..." for i, w in enumerate(compiled, 1)]
        assert lines.index(widths[0]) > pool[0]  # the pool is sized (and said) before the warm-up
        assert "buckets, 3 widths compiled in" in ready
    assert process.returncode == 0 and stdout.strip() == "stopped" and "Traceback" not in stderr


@pytest.mark.parametrize("model, flags, message", [
    ("qwen3", ["--max-seqs", "1000000", "--max-len", "512"], "(at most 90% of it for the pool): lower --max-seqs or --max-len"),
    ("qwen3", ["--max-seqs", "1000000"], "positions per slot in "),  # the 4 GiB a CPU pool takes, or half the free memory
    ("gla", ["--max-seqs", "100000000"], "(at most 90% of it for the pool): lower --max-seqs (or --state-dtype bfloat16)"),
], ids=["kv-max-len", "kv-fitted", "fixed-state"])
def test_a_pool_that_does_not_fit_is_refused_in_one_line_naming_the_flag(zoo_dir, assay_cli, model, flags, message):
    completed = assay_cli("serve", "--model", str(zoo_dir / model), "--port", "0", *flags, timeout=300)
    assert completed.returncode == 2, completed.stderr
    error = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and message in error[0], completed.stderr
    assert error[0].endswith(("--max-len", "(or give --max-len)", "bfloat16)")), error
    assert "Traceback" not in completed.stderr
    # What came before the refusal are the progress lines only: the load, and the pool's size when it was computed.
    others = [line for line in completed.stderr.splitlines() if not line.startswith("error: ")]
    assert others[0].startswith(f"loading {zoo_dir / model}") and all(line.startswith(("loading", "slot pool:")) for line in others)
