"""`assay triage`: turn a failing row into torch's minified repro, checked on its own (docs/triage.md).

A backend engineer cannot debug "FAIL_ACCURACY on a 7B model"; they can debug a 20-line script that
calls one operator. Triage reruns the row's own run.py in a child process with torch's minifier
switched on, lets the minifier shrink the failing graph within a time budget, and stores the smallest
script it wrote in the row (`repro_py`), after running that script alone to see it still fails
(`repro_verified`).

Three child processes, each with the time left in the budget (a minifier step that hangs or crashes
costs the budget, never the caller):
1. rerun: run.py under torch._dynamo.config.repro_after ("dynamo" or "aot") and repro_level (2: dump a
   launcher when compilation fails; 4: when the compiled graph's accuracy fails against float64;
   3: always, before compiling: a crash leaves no chance to dump afterwards);
2. minify: torch's minifier_launcher.py, which writes repro.py in its working folder each time it
   finds a smaller failing graph (a budget cut keeps the smallest so far);
3. verify: the repro, alone, in an empty folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from assay.core.errors import AssayError

TRIAGED = ("FAIL_COMPILE", "FAIL_ACCURACY", "CRASH")
REPRO_LEVEL = {"FAIL_COMPILE": 2, "FAIL_ACCURACY": 4, "CRASH": 3}
AFTER = ("dynamo", "aot")
VERIFY_LIMIT_S = 300.0
STDERR_TAIL = 4000
# Exceptions that only wrap the compiler's own: the failure's signature is the one they carry.
WRAPPERS = ("BackendCompilerFailed", "InternalTorchDynamoError", "TorchRuntimeError", "RuntimeError: Failed running")


@dataclass(frozen=True)
class TriageRequest:
    results: str
    model: str  # the row's model, or an unambiguous part of it
    stack: str | None = None  # stack_id or an unambiguous part; needed when the model has rows on several
    dtype: str | None = None
    budget_s: float = 600.0
    after: str = "dynamo"


@dataclass(frozen=True)
class TriageOutcome:
    repro_py: str | None
    repro_verified: bool | None  # None: nothing to verify (no repro)
    repro_after: str
    reason: str
    seconds: float

    def row_columns(self) -> dict:
        return {
            "repro_py": self.repro_py,
            "repro_lines": len(self.repro_py.splitlines()) if self.repro_py else None,
            "repro_verified": self.repro_verified,
            "repro_after": self.repro_after,
            "triage_reason": self.reason,
            "triage_s": self.seconds,
        }


def check_triage_options(budget_s: float, after: str) -> None:
    if budget_s <= 0:
        raise AssayError("--budget must be positive (seconds)")
    if after not in AFTER:
        raise AssayError(f"--after {after!r}: the minifier runs after dynamo or aot")


def find_row(results: str | Path, model: str, stack: str | None, dtype: str | None) -> dict:
    """The one row triage works on: bad input (no such row, several, a status triage does not handle) raises."""
    from assay.compat.results.dataset import query

    rows = query(results, stack=stack, model=model)
    exact = [r for r in rows if r["model"] == model]
    rows = exact or rows
    if dtype:
        rows = [r for r in rows if r["dtype"] == dtype]
    if not rows:
        raise AssayError(f"no row in {results} for model {model!r}" + (f" on stack {stack!r}" if stack else ""))
    if len(rows) > 1:
        names = ", ".join(sorted(f"{r['model']} ({r['dtype']}) on {r['stack_id']}" for r in rows))
        raise AssayError(f"{len(rows)} rows match, name one with --stack/--dtype: {names}")
    row = rows[0]
    if row["status"] not in TRIAGED:
        raise AssayError(f"{row['model']} on {row['stack_id']} is {row['status']}: triage handles {', '.join(TRIAGED)}")
    if (row.get("num_devices") or 1) > 1:
        raise AssayError(f"{row['model']} on {row['stack_id']} is sharded over {row['num_devices']} devices: triage reruns single-device rows")
    if not row.get("run_py"):
        raise AssayError(f"{row['model']} on {row['stack_id']} has no run_py to rerun")
    return row


def triage(request: TriageRequest, env: dict | None = None) -> dict:
    """Find the row, triage it, write it back with its repro columns, and return it."""
    from assay.compat.results.dataset import write_row

    check_triage_options(request.budget_s, request.after)
    row = find_row(request.results, request.model, request.stack, request.dtype)
    row.update(triage_row(row, request.budget_s, request.after, env).row_columns())
    write_row(request.results, row)
    return row


def triage_row(row: dict, budget_s: float, after: str = "dynamo", env: dict | None = None) -> TriageOutcome:
    """Rerun, minify and verify one failing row (its run_py), within budget_s seconds in all.

    env: added to the children's environment (ASSAY_PLUGINS names the modules that register the backend
    under test; their imports head the stored repro, which needs them as run.py needs the backend).
    """
    started = time.perf_counter()
    deadline = started + budget_s
    child_env = os.environ.copy() | (env or {})
    status = row["status"]
    plugins = [n.strip() for n in child_env.get("ASSAY_PLUGINS", "").split(",") if n.strip()]

    def outcome(repro: str | None, verified: bool | None, reason: str) -> TriageOutcome:
        return TriageOutcome(repro, verified, after, reason, time.perf_counter() - started)

    with tempfile.TemporaryDirectory(prefix="assay-triage-") as scratch_name:
        scratch = Path(scratch_name)
        rerun, minify, verify, debug = (scratch / name for name in ("rerun", "minify", "verify", "debug"))
        for folder in (rerun, minify, verify, debug):
            folder.mkdir()
        (rerun / "run.py").write_text(_with_cache_room(row["run_py"]))
        # 1. the failure again, with the minifier's dump switched on
        code, timed_out, stderr = _child(
            [sys.executable, "-m", "assay.compat.run.triage_worker", "rerun", "run.py", str(debug), after, str(REPRO_LEVEL[status])],
            rerun, child_env, deadline,
        )
        launchers = sorted(debug.rglob("minifier_launcher.py"), key=lambda p: p.stat().st_mtime)
        if not launchers:
            if timed_out:
                return outcome(None, None, f"the rerun under the minifier passed the {budget_s:g} s budget before it failed")
            said = _last_line(stderr)
            return outcome(None, None, f"the rerun did not fail the way the row did (exit code {code}; no minifier launcher written)" + (f": {said}" if said else ""))
        launcher = minify / "minifier_launcher.py"
        dumped = _unaliased(_inference_only(launchers[-1].read_text()))
        launcher.write_text(_plugin_imports(plugins) + dumped)
        # 2. torch's minifier: it rewrites minify/repro.py at every smaller failing graph
        code, timed_out, stderr = _child(
            [sys.executable, "-m", "assay.compat.run.triage_worker", "minify", str(launcher)], minify, child_env, deadline,
        )
        # Each smaller failing graph is saved as checkpoints/minified_<nodes>_nodes.py: the fewest nodes is the result.
        checkpoints = sorted(minify.glob("checkpoints/minified_*_nodes.py"), key=lambda p: int(p.stem.split("_")[1]))
        if checkpoints:
            repro = checkpoints[0].read_text()
            note = "minified" + (f" until the {budget_s:g} s budget ran out (the smallest failing graph so far)" if timed_out else "")
        else:
            # The minifier found nothing smaller (or died trying, as on a crashing compiler): the failing
            # graph itself, as a script that runs instead of minifying, is still far smaller than the model.
            repro = re.sub(r"command=(['\"])minify\1", "command='run'", dumped)
            note = "not minified (the minifier " + ("ran out of budget" if timed_out else f"wrote no repro: {_last_line(stderr) or f'exit code {code}'}") + "); the whole failing graph"
        repro = _plugin_imports(plugins) + _without_saved_inputs(_unaliased(_inference_only(repro)))
        # 3. the repro alone, in an empty folder, must fail the same way
        (verify / "repro.py").write_text(repro)
        remaining = deadline - time.perf_counter()
        if remaining <= 1:
            return outcome(repro, None, f"{note}; not verified: the {budget_s:g} s budget ran out")
        code, timed_out, stderr = _child([sys.executable, "repro.py"], verify, child_env, time.perf_counter() + min(remaining, VERIFY_LIMIT_S))
        verified = not timed_out and reproduces(status, row.get("error") or row.get("reason") or "", code, stderr)
        said = "reproduces the failure" if verified else f"does not reproduce the failure (exit code {code}{', timed out' if timed_out else ''}: {_last_line(stderr)})"
        return outcome(repro, verified, f"{note}; {len(repro.splitlines())} lines; alone it {said}")


def reproduces(status: str, original_error: str, code: int, stderr: str) -> bool:
    """Whether a repro's run failed the way the row did."""
    if status == "CRASH":
        return code < 0  # killed by a signal, as the probe was
    if code == 0:
        return False
    if status == "FAIL_ACCURACY":
        return "AccuracyError" in stderr
    signature = failure_signature(original_error)
    return signature is None or signature in stderr


def failure_signature(error: str) -> str | None:
    """The innermost exception message of a traceback (what the compiler itself said), at most 120 chars."""
    found = None
    for line in error.splitlines():
        match = re.match(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Failed|Unsupported))\s*:\s*(.+)$", line)
        if match and not any(w in line for w in WRAPPERS):
            found = match.group(2).strip()
    return found[:120] if found else None


def _plugin_imports(plugins: list[str]) -> str:
    if not plugins:
        return ""
    lines = "".join(f"import {name}\n" for name in plugins)
    return f"# The backend under test registers itself on import (ASSAY_PLUGINS when this was triaged):\n{lines}"


RERUN_MIN_TOKENS = 8


def _with_cache_room(run_py: str) -> str:
    """run.py generating at least RERUN_MIN_TOKENS tokens. The static cache holds exactly prompt + new
    tokens, and the minifier runs the dumped decode graph again and again, each run writing one more
    cache slot: with a row of 2 new tokens the graph soon writes past the cache's end, every candidate
    fails with that IndexError instead of the row's failure, and nothing gets smaller. The decode graph
    itself does not depend on the number of tokens."""
    return re.sub(r"^NEW_TOKENS = (\d+)$", lambda m: f"NEW_TOKENS = {max(int(m.group(1)), RERUN_MIN_TOKENS)}", run_py, flags=re.M)


def _inference_only(script: str) -> str:
    """The dumped graph's inputs without requires_grad: the probe generates under no_grad, but the dump
    marks parameters as requiring grad, and the minifier would then run a backward pass (through the
    static cache's in-place updates) that the probe never ran, failing for a reason of its own."""
    return script.replace(", requires_grad=True", "")


def _unaliased(script: str) -> str:
    """One storage per input tensor. torch's input writer stores storages by content hash, so distinct
    inputs with equal values (every layer's norm weight of ones, every layer's cache counter) come back
    as views of one storage; a graph that updates such inputs in place (a static cache's counters) then
    updates one tensor several times per call and fails for a reason the model never had."""
    storages: dict[str, str] = {}
    used: set[str] = set()
    lines = []
    for line in script.splitlines():
        storage = re.match(r"^(\s*)(buf\d+) = reader\.storage\((.*)\)\s*$", line)
        if storage:
            storages[storage.group(2)] = storage.group(3)
        tensor = re.match(r"^(\s*)reader\.tensor\((buf\d+)(,.*)$", line)
        if tensor and tensor.group(2) in storages:
            indent, name, rest = tensor.groups()
            if name in used:
                fresh = f"{name}_{len(used)}"
                while fresh in storages:
                    fresh += "_"
                storages[fresh] = storages[name]
                lines.append(f"{indent}{fresh} = reader.storage({storages[name]})")
                line = f"{indent}reader.tensor({fresh}{rest}"
                name = fresh
            used.add(name)
        lines.append(line)
    return "\n".join(lines) + ("\n" if script.endswith("\n") else "")


def _without_saved_inputs(repro: str) -> str:
    """Point the repro away from the minifier's scratch folder of saved inputs (deleted after triage):
    with save_dir=None torch's InputReader generates inputs of the recorded shapes, strides and dtypes."""
    return re.sub(r"save_dir=(r?(['\"]).*?\2)", "save_dir=None", repro)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _child(argv: list[str], cwd: Path, env: dict, deadline: float) -> tuple[int, bool, str]:
    """Run a child until it ends or the deadline: (returncode, timed_out, stderr tail)."""
    from assay.compat.run.isolate import run_fresh

    stderr_file = cwd / "stderr.txt"
    timeout = max(deadline - time.perf_counter(), 0.1)
    code, timed_out = run_fresh(argv, env, stderr_file, None, timeout, cwd=cwd)  # torch's minifier writes into cwd
    return code, timed_out, stderr_file.read_bytes().decode("utf-8", "replace")[-STDERR_TAIL:]
