"""A model's page: its result on every stack, and one result's details ready to show as text."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from assay.app.catalog import Catalog, CatalogModel
from assay.app.results.accuracy import drift_table, eval_note, eval_table
from assay.app.results.cells import cell_megabytes, cell_number, cell_text
from assay.app.results.snapshot import Snapshot
from assay.app.results.status import NOT_TESTED, result_label
from assay.compat.results.dataset import connect
from assay.compat.results.diff import eval_label
from assay.compat.results.signature import exception_line

MODEL_COLUMNS = [
    "stack", "tested as", "dtype", "result", "eval", "reason", "devices", "load s", "compile s", "decode tok/s", "total s", "peak MB",
]


@dataclass(frozen=True)
class ResultDetail:
    """One recorded result, every field ready to show as text."""

    label: str
    result: str
    reason: str
    error_line: str  # the exception line; the full traceback is `error`
    error: str
    stack_label: str
    versions: str  # pretty JSON of the whole stack
    run_py: str
    command: str
    facts: pd.DataFrame  # two columns: what, value (timings, memory, devices)
    repro_py: str = ""  # `assay triage`'s minified repro ("" when the row was not triaged)
    repro_note: str = ""  # its size, whether it reproduces alone, what triage did
    drift: pd.DataFrame | None = None  # accuracy.DRIFT_COLUMNS: the logit drift per compared step
    eval: pd.DataFrame | None = None  # accuracy.EVAL_COLUMNS: task accuracy, device next to reference
    eval_note: str = ""  # the eval's verdict and reason


@dataclass(frozen=True)
class ModelPage:
    key: str  # the public id or the tested name the page is about
    catalog_entry: CatalogModel | None
    table: pd.DataFrame  # MODEL_COLUMNS: one row per stack; stacks without a row say "not tested"
    results: list[dict]  # the full rows, in table order
    labels: list[str]  # one per result, to choose which one to detail


def result_key_label(row: dict) -> str:
    return f"{row['stack_id']} · {row['model']} · {row.get('dtype') or '-'}"


def _devices(row: dict) -> str:
    name = row.get("device_name") or row.get("device") or ""
    count = row.get("num_devices") or 1
    parallelism = row.get("parallelism")
    return f"{row.get('device') or ''} ×{count}" + (f" ({name})" if name and name != row.get("device") else "") + (
        f", {parallelism}" if parallelism else "")


def model_names(snapshot: Snapshot, catalog: Catalog) -> list[str]:
    """Every name a model page can be opened with: public ids (catalog and stand-ins) and tested names."""
    names = set(snapshot.rows["public"]) | set(snapshot.rows["model"]) | set(catalog.selected) | set(catalog.by_id)
    return sorted(names, key=str.lower)


def model_page(snapshot: Snapshot, catalog: Catalog, key: str) -> ModelPage:
    cursor = connect(snapshot.folder).execute(
        "SELECT * FROM results WHERE model = ? OR stands_in_for = ? ORDER BY stack_id, model, dtype", [key, key]
    )
    names = [d[0] for d in cursor.description]
    results = [dict(zip(names, values)) for values in cursor.fetchall()]
    by_stack: dict[str, list[dict]] = {}
    for row in results:
        by_stack.setdefault(row["stack_id"], []).append(row)
    table_rows, ordered = [], []
    for stack_id in sorted(set(snapshot.stacks) | set(by_stack)):
        stack_rows = by_stack.get(stack_id)
        if not stack_rows:
            table_rows.append([stack_id, "", "", NOT_TESTED] + [""] * (len(MODEL_COLUMNS) - 4))
            continue
        for row in stack_rows:
            ordered.append(row)
            table_rows.append([
                stack_id, cell_text(row["model"]), cell_text(row.get("dtype")), result_label(row["status"]), cell_text(eval_label(row)),
                cell_text(row.get("reason")),
                _devices(row), cell_number(row.get("load_s")), cell_number(row.get("compile_s")),
                cell_number(row.get("decode_tokens_per_s")), cell_number(row.get("total_s")), cell_megabytes(row.get("peak_memory_bytes")),
            ])
    table = pd.DataFrame(table_rows, columns=MODEL_COLUMNS, dtype=object)
    return ModelPage(key, catalog.by_id.get(key), table, ordered, [result_key_label(r) for r in ordered])


def result_detail(row: dict) -> ResultDetail:
    try:
        versions = json.dumps(json.loads(row["versions"]), indent=2, sort_keys=True) if row.get("versions") else ""
    except json.JSONDecodeError:
        versions = row["versions"]
    memory = cell_megabytes(row.get("peak_memory_bytes"))
    compile_counts = "/".join(cell_text(row.get(k)) or "-" for k in ("graphs", "graph_breaks", "recompiles"))
    facts = [
        ("load s", cell_number(row.get("load_s"))),
        ("compile s (compilation + first generate)", cell_number(row.get("compile_s"))),
        ("decode tokens/s (warm generate)", cell_number(row.get("decode_tokens_per_s"))),
        ("total s (compilation included)", cell_number(row.get("total_s"))),
        ("peak memory MB", f"{memory} ({row.get('memory_kind')})" if memory and row.get("memory_kind") else memory),
        ("devices", _devices(row)),
        ("backend", cell_text(row.get("backend"))),
        ("graphs / breaks / recompiles", compile_counts),
        ("check", cell_text(row.get("check"))),
        ("logit drift: max abs / max rel / min cosine", _drift_fact(row)),
        ("logit reference dtype", cell_text(row.get("logit_reference_dtype"))),
        ("graph breaks and recompiles (dynamo's reasons)", "; ".join(row.get("compile_reasons") or [])),
        ("new tokens", cell_text(row.get("new_tokens"))),
        ("started at", cell_text(row.get("started_at"))),
        ("assay version", cell_text(row.get("assay_version"))),
    ]
    error = cell_text(row.get("error"))
    return ResultDetail(
        label=result_key_label(row), result=result_label(row["status"]), reason=cell_text(row.get("reason")),
        error_line=exception_line(error) if error else "", error=error,
        stack_label=cell_text(row.get("stack_label")) or cell_text(row.get("stack_id")),
        versions=versions, run_py=cell_text(row.get("run_py")), command=cell_text(row.get("command")),
        facts=pd.DataFrame(facts, columns=["what", "value"], dtype=object),
        repro_py=cell_text(row.get("repro_py")), repro_note=repro_note(row),
        drift=drift_table(row), eval=eval_table(row), eval_note=eval_note(row),
    )


def _drift_fact(row: dict) -> str:
    if row.get("logit_max_rel_max") is None:
        return ""
    steps = len(row.get("logit_max_rel") or [])
    return (f"{cell_number(row.get('logit_max_abs_max'))} / {cell_number(row.get('logit_max_rel_max'))} / "
            f"{row['logit_cosine_min']:.9f} over {steps} step{'s' if steps != 1 else ''}")


def repro_note(row: dict) -> str:
    """One line about the row's minified repro: size, verified or not, what triage said."""
    if row.get("repro_py"):
        verified = {True: "reproduces the failure on its own", False: "did NOT reproduce the failure on its own",
                    None: "not verified"}[row.get("repro_verified")]
        return f"{row.get('repro_lines')} lines, minified after {row.get('repro_after')}; {verified}. {cell_text(row.get('triage_reason'))}"
    if row.get("triage_reason"):
        return f"no repro: {row['triage_reason']}"
    if row.get("status") in ("FAIL_COMPILE", "FAIL_ACCURACY", "CRASH"):
        return f"not triaged: assay triage RESULTS --model {row['model']} --stack {row['stack_id']}"
    return ""


def repro_py_filename(row: dict) -> str:
    return "repro" + run_py_filename(row).removeprefix("run")


def run_py_filename(row: dict) -> str:
    """A safe file name for a row's run.py download: run_<model>_<stack>_<dtype>.py."""
    import re

    safe = lambda text: re.sub(r"[^A-Za-z0-9._-]+", "_", text or "").strip("._")[:80] or "model"  # noqa: E731
    return f"run_{safe(row['model'])}_{safe(row['stack_id'])}_{safe(row.get('dtype') or 'default')}.py"
