"""Failure triage (docs/triage.md): logit drift on every row, dynamo's reasons, minified repros.

The misbehaving backends (tests/helpers/misbehaving_backends.py) are real aot_autograd compilers that
break one ATen operator: test_no_rsqrt refuses aten.rsqrt, test_wrong_silu scales aten.silu's output
by 3 (tokens flip), test_nudged_silu by 1.01 (tokens stay, the logits move).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assay.compat.results.dataset import query, write_row
from assay.compat.results.diff import diff_stacks
from assay.compat.probe.execute import probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.run.single import probe_and_record
from assay.compat.probe.reasons import combine, recompile_reasons
from assay.compat.results.schema import SCHEMA, SCHEMA_VERSION
from assay.core.compiling import CompileStats, compile_fn, watch


TESTS = str(Path(__file__).resolve().parents[1])
PLUGIN_ENV = {"ASSAY_PLUGINS": "helpers.misbehaving_backends", "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
NEW_TOKENS = 4
# float32 logits of the same model computed in a different op order (AOT autograd's graph vs eager)
# differ by a few ulps of the largest logit: 2**-23 ~ 1.2e-7 each, accumulated over two layers.
ROUND_OFF_REL = 1e-5


def _probe(zoo_dir, backend: str, **extra) -> dict:
    return probe(ProbeRequest(str(zoo_dir / "llama"), backend=backend, new_tokens=NEW_TOKENS, reference_cache=None, **extra))


def test_every_compared_step_has_its_logit_drift(zoo_dir):
    row = _probe(zoo_dir, "aot_eager")
    assert row["status"] == "PASS"
    for column in ("logit_max_abs", "logit_max_rel", "logit_cosine"):
        assert len(row[column]) == NEW_TOKENS, column
    assert row["logit_max_rel_max"] == max(row["logit_max_rel"]) < ROUND_OFF_REL
    assert row["logit_max_abs_max"] == max(row["logit_max_abs"])
    assert row["logit_cosine_min"] == min(row["logit_cosine"]) > 1 - 1e-9
    assert row["logit_reference_dtype"] == "float32"


@pytest.mark.slow  # two probes
def test_a_small_fault_shows_in_drift_and_in_diff_before_any_token_flips(zoo_dir, tmp_path):
    healthy = probe_and_record(ProbeRequest(str(zoo_dir / "llama"), backend="aot_eager", new_tokens=NEW_TOKENS, reference_cache=None), tmp_path)
    nudged = probe_and_record(ProbeRequest(str(zoo_dir / "llama"), backend="test_nudged_silu", new_tokens=NEW_TOKENS, reference_cache=None), tmp_path)
    assert healthy["status"] == nudged["status"] == "PASS"  # the status rule is unchanged: tokens equal
    # silu x 1.01 moves the logits by ~1e-3 of their scale: far above round-off, far below a token flip.
    assert nudged["logit_max_rel_max"] > 100 * max(healthy["logit_max_rel_max"], ROUND_OFF_REL / 100)
    assert nudged["logit_cosine_min"] < healthy["logit_cosine_min"]
    result = diff_stacks(tmp_path, healthy["stack_id"], nudged["stack_id"])
    [change] = result.changes
    assert change.kind == "drift_regressed" and change.new_drift == nudged["logit_max_rel_max"]
    backwards = diff_stacks(tmp_path, nudged["stack_id"], healthy["stack_id"])
    assert backwards.changes[0].kind == "both_pass"  # less drift is no regression


def test_drift_is_compared_up_to_the_first_token_mismatch(zoo_dir):
    row = _probe(zoo_dir, "test_wrong_silu")
    assert row["status"] == "FAIL_ACCURACY"
    # After the first mismatch the two runs condition on different tokens: no longer comparable.
    assert len(row["logit_max_rel"]) == row["first_mismatch"] + 1
    assert row["logit_max_rel"][0] == 0.0  # step 0 is the eager prefill on the same CPU: bit-equal
    assert row["logit_max_rel_max"] > 0.05 and row["logit_cosine_min"] < 0.999


@pytest.mark.slow  # two probes
def test_a_float64_reference_measures_the_float32_run_error(zoo_dir, tmp_path):
    request = ProbeRequest(str(zoo_dir / "llama"), backend="aot_eager", new_tokens=NEW_TOKENS, reference_dtype="float64",
                           reference_cache=str(tmp_path / "refs"))
    row = probe(request)
    assert row["status"] == "PASS" and row["logit_reference_dtype"] == "float64"
    # float32 vs float64: nonzero at every step, prefill included, and within float32's round-off.
    assert all(0 < value < ROUND_OFF_REL for value in row["logit_max_rel"])
    again = probe(request)  # the float64 reference and its logits come back from the cache
    assert again["reference_cache_hit"] is True and again["logit_max_rel"] == row["logit_max_rel"]


def test_graph_break_and_recompile_reasons_are_short_and_deduplicated():
    import torch

    def step(x):
        x = x * 2
        torch._dynamo.graph_break()
        return x + 1

    torch._dynamo.reset()
    stats = CompileStats()
    compiled = compile_fn(step, "aot_eager", stats, dynamic=False)
    with watch(stats), recompile_reasons() as recompiles:
        for shape in (3, 3, 5, 5):  # a new shape without dynamic shapes: a recompile, once
            compiled(torch.ones(shape))
    reasons = combine(stats.break_reasons, recompiles)
    breaks = [r for r in reasons if r.startswith("break: ")]
    again = [r for r in reasons if r.startswith("recompile: ")]
    assert len(breaks) == 1 and "graph_break" in breaks[0].lower()
    assert again and any("size mismatch" in r or "tensor 'x'" in r for r in again), again
    assert len(reasons) == len(set(reasons)) and all(len(r) <= len("recompile: ") + 160 for r in reasons)


def test_schema_3_files_still_read_with_the_new_columns_null(tmp_path):
    old_columns = [f for f in SCHEMA if not f.name.startswith(("logit_", "repro_", "triage_", "compile_reasons"))]
    row = {f.name: None for f in old_columns} | {"schema_version": 3, "model": "m", "status": "PASS", "device": "cpu",
                                                  "backend": "eager", "stack_id": "cpu-eager-v3", "dtype": "float32"}
    pq.write_table(pa.Table.from_pylist([row], schema=pa.schema(old_columns)), tmp_path / "cpu-eager-v3.parquet")
    write_row(tmp_path, row | {"stack_id": "cpu-eager-v4", "logit_max_rel_max": 0.5})
    rows = {r["stack_id"]: r for r in query(tmp_path)}
    assert rows["cpu-eager-v3"]["schema_version"] == 3 and rows["cpu-eager-v3"]["logit_max_rel"] is None
    assert rows["cpu-eager-v4"]["schema_version"] == SCHEMA_VERSION
    assert diff_stacks(tmp_path, "v3", "v4").changes[0].kind == "both_pass"  # no drift on the base: nothing to compare


def _run_repro(repro: str, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir()
    (folder / "repro.py").write_text(repro)
    return subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300,
                          env=os.environ | PLUGIN_ENV)


def _graph_calls(repro: str) -> list[str]:
    """The torch calls of the repro's forward: what the minified graph computes."""
    forward = repro.split("def forward", 1)[1].split("\nmod = Repro()", 1)[0]
    return [line.strip() for line in forward.splitlines()[1:] if "torch." in line]


@pytest.mark.slow
def test_triage_minifies_a_compiler_that_fails_on_one_operator(zoo_dir, tmp_path, assay_cli):
    out = tmp_path / "results"
    probe = assay_cli("probe", str(zoo_dir / "llama"), "--backend", "test_no_rsqrt", "--new-tokens", "2", "--no-reference-cache",
                      "--out", str(out), env=PLUGIN_ENV)
    assert probe.returncode == 0, probe.stderr
    result = assay_cli("triage", str(out), "--model", "assay-zoo/llama", "--budget", "400", "--json", env=PLUGIN_ENV)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["status"] == "FAIL_COMPILE" and shown["repro_verified"] is True, shown["triage_reason"]
    [row] = query(out)
    repro = row["repro_py"]
    assert row["repro_lines"] == len(repro.splitlines()) and row["repro_after"] == "dynamo"
    # The model's decode graph has ~180 nodes (two layers); the repro keeps the one operator the compiler refuses.
    calls = _graph_calls(repro)
    assert any("rsqrt" in call for call in calls) and len(calls) <= 3, (row["triage_reason"], calls)
    assert row["repro_lines"] < 80
    alone = _run_repro(repro, tmp_path / "alone")
    assert alone.returncode != 0 and "vendor compiler: no kernel for aten.rsqrt" in alone.stderr


@pytest.mark.slow
def test_probe_triage_minifies_an_operator_with_a_wrong_output(zoo_dir, tmp_path, assay_cli):
    out = tmp_path / "results"
    result = assay_cli("probe", str(zoo_dir / "llama"), "--backend", "test_wrong_silu", "--new-tokens", "2", "--no-reference-cache",
                       "--triage", "--triage-budget", "400", "--out", str(out), env=PLUGIN_ENV)
    assert result.returncode == 0, result.stderr
    [row] = query(out)
    assert row["status"] == "FAIL_ACCURACY" and row["repro_verified"] is True, row["triage_reason"]
    calls = _graph_calls(row["repro_py"])
    assert any("silu" in call for call in calls) and len(calls) <= 3, (row["triage_reason"], calls)
    assert "accuracy=True" in row["repro_py"]  # torch's accuracy repro: compiled vs eager against float64
    alone = _run_repro(row["repro_py"], tmp_path / "alone")
    assert alone.returncode != 0 and "AccuracyError" in alone.stderr


def test_triage_refuses_a_row_it_cannot_help_with(tmp_path, assay_cli):
    from compat.test_dataset import make_row

    write_row(tmp_path, make_row("assay-zoo/fine", status="PASS"))
    passed = assay_cli("triage", str(tmp_path), "--model", "assay-zoo/fine")
    assert passed.returncode == 2 and "is PASS: triage handles FAIL_COMPILE, FAIL_ACCURACY, CRASH" in passed.stderr
    assert "Traceback" not in passed.stderr
    missing = assay_cli("triage", str(tmp_path), "--model", "nothing-like-it")
    assert missing.returncode == 2 and "no row" in missing.stderr
    bad_after = assay_cli("triage", str(tmp_path), "--model", "assay-zoo/fine", "--after", "inductor")
    assert bad_after.returncode == 2 and "--after" in bad_after.stderr
    [row] = query(tmp_path)
    assert row["repro_py"] is None and row["triage_reason"] is None  # nothing written


@pytest.mark.slow
def test_triage_of_a_crashing_compiler_keeps_a_repro_that_crashes_alone(zoo_dir, tmp_path, assay_cli):
    # test_segfault dereferences NULL inside the compiler: the probe's own process dies of SIGSEGV (CRASH).
    out = tmp_path / "results"
    probe = assay_cli("probe", str(zoo_dir / "llama"), "--backend", "test_segfault", "--new-tokens", "2", "--no-reference-cache",
                      "--timeout", "300", "--out", str(out), env=PLUGIN_ENV)  # --timeout: its own process
    [row] = query(out)
    assert row["status"] == "CRASH", (probe.returncode, row["status"], row["reason"])
    result = assay_cli("triage", str(out), "--model", "assay-zoo/llama", "--budget", "300", "--json", env=PLUGIN_ENV)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["status"] == "CRASH" and shown["repro_verified"] is True, shown["triage_reason"]
    [row] = query(out)
    assert row["repro_py"] and row["repro_lines"] == len(row["repro_py"].splitlines())
    alone = _run_repro(row["repro_py"], tmp_path / "alone")
    assert alone.returncode < 0, (alone.returncode, alone.stderr[-500:])  # killed by a signal, as the probe was
