"""What the app shows, as pure functions over the results dataset: no Gradio here.

The folder's stack files are read once into a light index (no run.py, no token lists; errors kept
only as their signature) and read again when a file changes. Searching and filtering run over that
index in memory; a model's page reads its full rows with DuckDB. Nothing here writes to the folder.

Statuses as shown: a recorded status (PASS, FAIL_*, OOM, TIMEOUT, CRASH), "skipped" for a
deliberate SKIPPED, and "not tested" for a catalog model with no row: the last two never count as
failures.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from assay.app.catalog import Catalog, CatalogModel
from assay.compat.dataset import check_results, connect, stack_files
from assay.compat.diff import diff_stacks
from assay.compat.schema import FAILURES, STATUSES
from assay.compat.signature import error_signature, exception_line

ANY = "any"
NOT_TESTED = "not tested"
SKIPPED = "skipped"
ANY_FAILURE = "any failure"
SELECTED, TRENDING, DOWNLOADS, ALL_RESULTS = "Selected", "Trending", "Downloads", "All results"
VIEWS = (SELECTED, TRENDING, DOWNLOADS, ALL_RESULTS)
# The browser gets at most this many rows: a 10,000-row table helps nobody and costs seconds to send.
DEFAULT_LIMIT = 500

LIST_COLUMNS = [
    "#", "model", "tested as", "task", "result", "reason", "stack", "dtype", "device", "compiler", "transformers",
    "total s", "peak MB", "downloads", "likes", "trending",
]
MODEL_COLUMNS = [
    "stack", "tested as", "dtype", "result", "reason", "devices", "load s", "compile s", "decode tok/s", "total s", "peak MB",
]
DIFF_COLUMNS = ["change", "model", "dtype", "base", "new", "base reason", "new reason"]
GROUP_COLUMNS = ["count", "signature", "statuses", "models", "stacks", "graph breaks and recompiles"]
PASS_RATE_COLUMNS = ["stack", "passed", "failed", "skipped", "tested", "pass rate"]

_INDEX_SQL = """
SELECT model, stands_in_for, task, architecture, status, reason, device, device_name, backend, dtype, num_devices,
       parallelism, stack_id, stack_label, versions, load_s, compile_s, decode_tokens_per_s, total_s,
       peak_memory_bytes, memory_kind, logit_max_rel_max, logit_cosine_min, compile_reasons, repro_verified,
       CASE WHEN status IN ({failures}) THEN coalesce(error, reason, status) END AS failure_text
FROM results
"""


# ---------------------------------------------------------------- versions


@lru_cache(maxsize=1024)
def _parsed_versions(versions_json: str | None) -> tuple[str, str]:
    # Every row of a stack carries the same versions JSON: parse each distinct string once.
    try:
        record = json.loads(versions_json) if versions_json else {}
    except json.JSONDecodeError:
        record = {}
    return compiler_version(record), transformers_version(record)


def compiler_version(versions: dict) -> str:
    """versions["compiler"] as one string: "torch 2.13.0+cpu, triton 3.9.0"; "none" for eager backends."""
    compiler = versions.get("compiler") if isinstance(versions, dict) else None
    if isinstance(compiler, dict):
        return ", ".join(f"{name} {version}" for name, version in compiler.items() if version) or "none"
    if compiler:
        return str(compiler)
    return "unknown"


def transformers_version(versions: dict) -> str:
    libraries = versions.get("libraries") if isinstance(versions, dict) else None
    if isinstance(libraries, dict) and libraries.get("transformers"):
        return str(libraries["transformers"])
    return "unknown"


def result_label(status: str | None) -> str:
    if status is None:
        return NOT_TESTED
    return SKIPPED if status == "SKIPPED" else status


# A shown status's colour (CSS for its table cell). The text stays in the cell: the colour only
# repeats it, so the tables read the same without colour. Light backgrounds keep the text's contrast.
STATUS_COLOURS = {
    "pass": "background-color: #d3f0d9; color: #14532d",  # green
    "failure": "background-color: #fbd5d5; color: #7f1d1d",  # red: FAIL_*
    "abnormal": "background-color: #fde9c4; color: #713f12",  # amber: TIMEOUT, OOM, CRASH
    "neutral": "background-color: #e5e7eb; color: #374151",  # grey: skipped, not tested
}


def status_kind(label: str) -> str | None:
    """pass, failure, abnormal or neutral for a shown status; None for any other text."""
    if label == "PASS":
        return "pass"
    if label.startswith("FAIL"):
        return "failure"
    if label in ("TIMEOUT", "OOM", "CRASH"):
        return "abnormal"
    if label in (SKIPPED, NOT_TESTED, "SKIPPED"):
        return "neutral"
    return None


def status_style(label) -> str:
    kind = status_kind(label) if isinstance(label, str) else None
    return STATUS_COLOURS[kind] if kind else ""


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class Snapshot:
    """The index of one folder's results at one moment: one row per (stack, model, dtype)."""

    folder: Path
    rows: pd.DataFrame
    stacks: tuple[str, ...]
    stamp: tuple = field(default=(), compare=False)


def _stamp(folder: Path) -> tuple:
    # A results folder's own files or a published folder's (its card names them): the same reader for both.
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in stack_files(folder))


def load_snapshot(folder: str | Path) -> Snapshot:
    folder = check_results(folder)
    stamp = _stamp(folder)
    sql = _INDEX_SQL.format(failures=", ".join(f"'{s}'" for s in FAILURES))
    rows = connect(folder).execute(sql).fetch_df()
    if rows.empty:
        rows = pd.DataFrame(columns=[*rows.columns])
    rows = rows.astype({"stands_in_for": object, "task": object, "reason": object, "failure_text": object})
    parsed = [_parsed_versions(v) for v in rows["versions"]]
    rows["compiler"] = [p[0] for p in parsed]
    rows["transformers"] = [p[1] for p in parsed]
    rows["public"] = rows["stands_in_for"].where(rows["stands_in_for"].notna() & (rows["stands_in_for"] != ""), rows["model"])
    rows["result"] = [result_label(s) for s in rows["status"]]
    rows["signature"] = [error_signature(t) if isinstance(t, str) else "" for t in rows["failure_text"]]
    rows["search"] = (rows["model"].str.lower() + "\n" + rows["public"].str.lower()) if len(rows) else pd.Series(dtype=object)
    rows = rows.drop(columns=["versions", "failure_text"]).sort_values(["public", "model", "stack_id", "dtype"], kind="stable")
    return Snapshot(folder, rows.reset_index(drop=True), tuple(sorted(rows["stack_id"].unique())), stamp)


class ResultsSource:
    """The folder's current snapshot, read again only when a stack file changed (cheap stat per call)."""

    def __init__(self, folder: str | Path):
        self.folder = check_results(folder)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._snapshot is None or self._snapshot.stamp != _stamp(self.folder):
                self._snapshot = load_snapshot(self.folder)
            return self._snapshot


# ---------------------------------------------------------------- filters and listing


@dataclass(frozen=True)
class Filters:
    text: str = ""  # part of the model name (the tested name or the public id), any case
    compiler: str = ANY
    transformers: str = ANY
    device: str = ANY
    status: str = ANY  # a status, "skipped", "not tested" or "any failure"
    task: str = ANY
    stack: str = ANY


@dataclass(frozen=True)
class Choices:
    compilers: list[str]
    transformers: list[str]
    devices: list[str]
    statuses: list[str]
    tasks: list[str]
    stacks: list[str]


def filter_choices(snapshot: Snapshot, catalog: Catalog) -> Choices:
    rows = snapshot.rows
    distinct = lambda column: [ANY] + sorted({str(v) for v in rows[column].dropna()})  # noqa: E731
    tasks = {str(v) for v in rows["task"].dropna()} | {m.task for m in catalog.models if m.task}
    statuses = [ANY, "PASS", ANY_FAILURE, *FAILURES, SKIPPED, NOT_TESTED]
    return Choices(distinct("compiler"), distinct("transformers"), distinct("device"), statuses, [ANY] + sorted(tasks),
                   [ANY, *snapshot.stacks])


def _row_mask(rows: pd.DataFrame, filters: Filters) -> pd.Series:
    mask = pd.Series(True, index=rows.index)
    for column, wanted in (("compiler", filters.compiler), ("transformers", filters.transformers), ("device", filters.device),
                           ("task", filters.task), ("stack_id", filters.stack)):
        if wanted and wanted != ANY:
            mask &= rows[column] == wanted
    return mask


def _text_mask(search: pd.Series, text: str) -> pd.Series:
    text = text.strip().lower()
    if not text:
        return pd.Series(True, index=search.index)
    return search.str.contains(text, regex=False)


def _status_mask(results: pd.Series, status: str) -> pd.Series:
    if not status or status == ANY:
        return pd.Series(True, index=results.index)
    if status == ANY_FAILURE:
        return results.isin(FAILURES)
    return results == (SKIPPED if status == "SKIPPED" else status)


def filter_results(snapshot: Snapshot, filters: Filters) -> pd.DataFrame:
    """Result rows matching every filter (the All results view, before display)."""
    rows = snapshot.rows
    mask = _row_mask(rows, filters) & _text_mask(rows["search"], filters.text) & _status_mask(rows["result"], filters.status)
    return rows[mask]


def _catalog_frame(catalog: Catalog, view: str, rows: pd.DataFrame) -> pd.DataFrame:
    if view == SELECTED:
        models = [catalog.by_id.get(i) or CatalogModel(i) for i in catalog.selected]
    else:
        key = "trending_score" if view == TRENDING else "downloads"
        # The Hub's ranking: only models that have the field are in it.
        models = sorted((m for m in catalog.models if getattr(m, key) is not None), key=lambda m: -getattr(m, key))
    frame = pd.DataFrame(
        {
            "public": [m.id for m in models], "catalog_task": [m.task for m in models],
            "downloads": [m.downloads for m in models], "likes": [m.likes for m in models],
            "trending": [m.trending_score for m in models],
        },
    ).astype({"public": object, "catalog_task": object, "downloads": object, "likes": object, "trending": object})
    # A selected model whose catalog entry has no task takes its results' task.
    known = rows.dropna(subset=["task"]).drop_duplicates("public").set_index("public")["task"]
    frame["catalog_task"] = [t if t else known.get(p) for p, t in zip(frame["public"], frame["catalog_task"])]
    return frame.drop_duplicates("public")


@dataclass(frozen=True)
class Listing:
    table: pd.DataFrame  # LIST_COLUMNS, every cell a string
    total: int  # rows matching, before the display limit
    note: str  # one line for the user: counts, truncation, why a view is empty


def list_view(snapshot: Snapshot, catalog: Catalog, view: str, filters: Filters, limit: int = DEFAULT_LIMIT) -> Listing:
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}")
    rows = snapshot.rows
    if view == ALL_RESULTS:
        matched = filter_results(snapshot, filters).assign(rank=None, downloads=None, likes=None, trending=None)
    else:
        frame = _catalog_frame(catalog, view, rows)
        if filters.task and filters.task != ANY:
            frame = frame[frame["catalog_task"] == filters.task]
        frame = frame.assign(rank=range(1, len(frame) + 1))
        tested = rows[_row_mask(rows, filters)]
        matched = frame.merge(tested, how="left", on="public", sort=False)
        matched["result"] = matched["result"].astype(object).fillna(NOT_TESTED)
        matched["task"] = matched["task"].where(matched["task"].notna(), matched["catalog_task"])
        search = matched["public"].str.lower() + "\n" + matched["model"].fillna("").str.lower()
        matched = matched[_text_mask(search, filters.text) & _status_mask(matched["result"], filters.status)]
    total = len(matched)
    table = _display(matched.head(limit))
    return Listing(table, total, _listing_note(view, catalog, total, len(table), len(snapshot.rows)))


def _listing_note(view: str, catalog: Catalog, total: int, shown: int, recorded: int) -> str:
    if view in (TRENDING, DOWNLOADS) and not any(
        getattr(m, "trending_score" if view == TRENDING else "downloads") is not None for m in catalog.models
    ):
        return f"The catalog has no {view.lower()} ranking: fill it with `assay catalog refresh --task text-generation`."
    if view == SELECTED and not catalog.selected:
        return "The catalog selects no models."
    if view == ALL_RESULTS and recorded == 0:
        return "No results recorded yet."
    shown_note = f"showing the first {shown:,} of {total:,} rows; search or filter to narrow" if shown < total else f"{total:,} rows"
    return f"{view}: {shown_note}."


def _text(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    return str(value)


def _number(value, digits: int = 3) -> str:
    if value is None or pd.isna(value):
        return ""
    value = float(value)
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def _megabytes(value) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value) / 2**20:,.1f}"


def _count(value) -> str:
    return "" if value is None or pd.isna(value) else f"{int(value):,}"


def _display(matched: pd.DataFrame) -> pd.DataFrame:
    columns = {
        "#": [_count(v) for v in matched["rank"]],
        "model": [_text(v) for v in matched["public"]],
        "tested as": [_text(v) for v in matched["model"]],
        "task": [_text(v) for v in matched["task"]],
        "result": [_text(v) for v in matched["result"]],
        "reason": [_text(v) for v in matched["reason"]],
        "stack": [_text(v) for v in matched["stack_id"]],
        "dtype": [_text(v) for v in matched["dtype"]],
        "device": [_text(v) for v in matched["device"]],
        "compiler": [_text(v) for v in matched["compiler"]],
        "transformers": [_text(v) for v in matched["transformers"]],
        "total s": [_number(v) for v in matched["total_s"]],
        "peak MB": [_megabytes(v) for v in matched["peak_memory_bytes"]],
        "downloads": [_count(v) for v in matched["downloads"]],
        "likes": [_count(v) for v in matched["likes"]],
        "trending": [_number(v) for v in matched["trending"]],
    }
    return pd.DataFrame(columns, columns=LIST_COLUMNS, dtype=object)


# ---------------------------------------------------------------- shareable views


# The query parameters a link may carry, in the order a link writes them.
QUERY_KEYS = ("model", "stack", "view", "q", "status", "compiler", "transformers", "device", "task")


@dataclass(frozen=True)
class View:
    """What a URL asks the app to show: the Models tab's controls, and a model page when `model` is set."""

    view: str = SELECTED
    filters: Filters = Filters()
    model: str | None = None  # open this model's page
    ignored: tuple[str, ...] = ()  # parameters whose value is not one the app offers


def view_from_query(params: dict[str, str], choices: Choices, names: list[str]) -> View:
    """The view a link's query parameters ask for; values the app does not offer are ignored (and listed)."""
    ignored: list[str] = []

    def pick(key: str, offered: list[str] | tuple[str, ...]) -> str | None:
        wanted = (params.get(key) or "").strip()
        if not wanted:
            return None
        by_lower = {o.lower(): o for o in offered}
        if wanted.lower() in by_lower:
            return by_lower[wanted.lower()]
        ignored.append(key)
        return None

    model = (params.get("model") or "").strip() or None
    if model is not None and model not in names:
        ignored.append("model")
        model = None
    filters = Filters(
        text=(params.get("q") or "").strip(), compiler=pick("compiler", choices.compilers) or ANY,
        transformers=pick("transformers", choices.transformers) or ANY, device=pick("device", choices.devices) or ANY,
        status=pick("status", choices.statuses) or ANY, task=pick("task", choices.tasks) or ANY,
        stack=pick("stack", choices.stacks) or ANY,
    )
    return View(pick("view", VIEWS) or SELECTED, filters, model, tuple(ignored))


def view_query(view: str = SELECTED, filters: Filters = Filters(), model: str | None = None) -> str:
    """The query string (with its "?") of a link that opens the app on this view; every value percent-encoded."""
    from urllib.parse import urlencode

    values = {"model": model, "stack": filters.stack, "view": view, "q": filters.text.strip(), "status": filters.status,
              "compiler": filters.compiler, "transformers": filters.transformers, "device": filters.device, "task": filters.task}
    defaults = {"view": SELECTED}
    kept = {k: values[k] for k in QUERY_KEYS if values[k] and values[k] != ANY and values[k] != defaults.get(k)}
    return "?" + urlencode(kept, quote_via=_quote_all) if kept else "?"


def _quote_all(text, safe="", encoding=None, errors=None) -> str:
    from urllib.parse import quote

    # Nothing but [A-Za-z0-9_.~-] and %XX: a model name cannot close the href or start markup.
    return quote(text, safe="", encoding=encoding, errors=errors)


# ---------------------------------------------------------------- a model's page


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


@dataclass(frozen=True)
class ModelPage:
    key: str  # the public id or the tested name the page is about
    catalog_entry: CatalogModel | None
    table: pd.DataFrame  # MODEL_COLUMNS: one row per stack; stacks without a row say "not tested"
    results: list[dict]  # the full rows, in table order
    labels: list[str]  # one per result, to choose which one to detail


def _result_key_label(row: dict) -> str:
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
                stack_id, _text(row["model"]), _text(row.get("dtype")), result_label(row["status"]), _text(row.get("reason")),
                _devices(row), _number(row.get("load_s")), _number(row.get("compile_s")),
                _number(row.get("decode_tokens_per_s")), _number(row.get("total_s")), _megabytes(row.get("peak_memory_bytes")),
            ])
    table = pd.DataFrame(table_rows, columns=MODEL_COLUMNS, dtype=object)
    return ModelPage(key, catalog.by_id.get(key), table, ordered, [_result_key_label(r) for r in ordered])


def result_detail(row: dict) -> ResultDetail:
    try:
        versions = json.dumps(json.loads(row["versions"]), indent=2, sort_keys=True) if row.get("versions") else ""
    except json.JSONDecodeError:
        versions = row["versions"]
    memory = _megabytes(row.get("peak_memory_bytes"))
    compile_counts = "/".join(_text(row.get(k)) or "-" for k in ("graphs", "graph_breaks", "recompiles"))
    facts = [
        ("load s", _number(row.get("load_s"))),
        ("compile s (compilation + first generate)", _number(row.get("compile_s"))),
        ("decode tokens/s (warm generate)", _number(row.get("decode_tokens_per_s"))),
        ("total s (compilation included)", _number(row.get("total_s"))),
        ("peak memory MB", f"{memory} ({row.get('memory_kind')})" if memory and row.get("memory_kind") else memory),
        ("devices", _devices(row)),
        ("backend", _text(row.get("backend"))),
        ("graphs / breaks / recompiles", compile_counts),
        ("check", _text(row.get("check"))),
        ("logit drift: max abs / max rel / min cosine", _drift_fact(row)),
        ("logit reference dtype", _text(row.get("logit_reference_dtype"))),
        ("graph breaks and recompiles (dynamo's reasons)", "; ".join(row.get("compile_reasons") or [])),
        ("new tokens", _text(row.get("new_tokens"))),
        ("started at", _text(row.get("started_at"))),
        ("assay version", _text(row.get("assay_version"))),
    ]
    error = _text(row.get("error"))
    return ResultDetail(
        label=_result_key_label(row), result=result_label(row["status"]), reason=_text(row.get("reason")),
        error_line=exception_line(error) if error else "", error=error,
        stack_label=_text(row.get("stack_label")) or _text(row.get("stack_id")),
        versions=versions, run_py=_text(row.get("run_py")), command=_text(row.get("command")),
        facts=pd.DataFrame(facts, columns=["what", "value"], dtype=object),
        repro_py=_text(row.get("repro_py")), repro_note=repro_note(row),
    )


def _drift_fact(row: dict) -> str:
    if row.get("logit_max_rel_max") is None:
        return ""
    steps = len(row.get("logit_max_rel") or [])
    return (f"{_number(row.get('logit_max_abs_max'))} / {_number(row.get('logit_max_rel_max'))} / "
            f"{row['logit_cosine_min']:.9f} over {steps} step{'s' if steps != 1 else ''}")


def repro_note(row: dict) -> str:
    """One line about the row's minified repro: size, verified or not, what triage said."""
    if row.get("repro_py"):
        verified = {True: "reproduces the failure on its own", False: "did NOT reproduce the failure on its own",
                    None: "not verified"}[row.get("repro_verified")]
        return f"{row.get('repro_lines')} lines, minified after {row.get('repro_after')}; {verified}. {_text(row.get('triage_reason'))}"
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


# ---------------------------------------------------------------- compare, failures, charts


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # DIFF_COLUMNS, regressions first
    summary: str


def compare_stacks(folder: str | Path, base: str, new: str) -> Comparison:
    result = diff_stacks(folder, base, new)
    shown = lambda status: NOT_TESTED if status is None else result_label(status)  # noqa: E731
    table = pd.DataFrame(
        [[c.kind.replace("_", " "), c.model, _text(c.dtype), shown(c.base_status), shown(c.new_status), _text(c.base_reason),
          _text(c.new_reason)] for c in result.changes],
        columns=DIFF_COLUMNS, dtype=object,
    )
    rate = lambda r: "-" if r is None else f"{100 * r:.0f}%"  # noqa: E731
    counts = ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in result.counts().items() if n)
    summary = (f"{result.base} → {result.new}: pass rate over the {result.models_on_both} models tested on both "
               f"{rate(result.base_pass_rate)} → {rate(result.new_pass_rate)}; {counts or 'no models'}")
    return Comparison(table, summary)


@dataclass(frozen=True)
class FailureGroups:
    table: pd.DataFrame  # GROUP_COLUMNS, largest group first
    models: dict[str, list[str]]  # signature -> every model in the group


def failure_groups(snapshot: Snapshot, filters: Filters, shown_models: int = 12) -> FailureGroups:
    rows = snapshot.rows
    failed = rows[rows["status"].isin(FAILURES) & _row_mask(rows, filters) & _text_mask(rows["search"], filters.text)]
    records, members = [], {}
    for signature, group in failed.groupby("signature", sort=False):
        models = sorted(set(group["model"]), key=str.lower)
        members[signature] = models
        more = f" … and {len(models) - shown_models} more" if len(models) > shown_models else ""
        records.append([len(group), signature, ", ".join(sorted(set(group["status"]))), ", ".join(models[:shown_models]) + more,
                        ", ".join(sorted(set(group["stack_id"]))), group_reasons(group["compile_reasons"])])
    records.sort(key=lambda r: (-r[0], r[1]))
    table = pd.DataFrame([[str(r[0]), *r[1:]] for r in records], columns=GROUP_COLUMNS, dtype=object)
    return FailureGroups(table, members)


def group_reasons(reasons: pd.Series, shown: int = 4) -> str:
    """The dynamo graph-break and recompile reasons of a failure group's rows, most frequent first: rows
    that failed alike for the same dynamo reason are one problem; the same error with different
    reasons may be several."""
    counts: dict[str, int] = {}
    for row_reasons in reasons:
        listed = row_reasons is not None and not isinstance(row_reasons, (float, type(pd.NA)))  # null: no reasons recorded
        for reason in (row_reasons if listed else []):
            counts[str(reason)] = counts.get(str(reason), 0) + 1
    ranked = sorted(counts, key=lambda r: (-counts[r], r))
    more = f" … and {len(ranked) - shown} more" if len(ranked) > shown else ""
    return "; ".join(f"{r} ({counts[r]})" if counts[r] > 1 else r for r in ranked[:shown]) + more


def pass_rates(snapshot: Snapshot) -> pd.DataFrame:
    """Per stack: PASS over tested rows; skipped rows are counted apart, never as tested or failed."""
    rows = snapshot.rows
    records = []
    for stack_id in snapshot.stacks:
        statuses = rows.loc[rows["stack_id"] == stack_id, "status"]
        passed, skipped = int((statuses == "PASS").sum()), int((statuses == "SKIPPED").sum())
        tested = len(statuses) - skipped
        records.append([stack_id, passed, tested - passed, skipped, tested, passed / tested if tested else None])
    return pd.DataFrame(records, columns=PASS_RATE_COLUMNS)


def per_model_costs(snapshot: Snapshot, stack: str, top: int = 25) -> pd.DataFrame:
    """Compile time and peak memory per model on one stack, the `top` slowest compiles first."""
    rows = snapshot.rows
    chosen = rows[(rows["stack_id"] == stack) & (rows["status"] != "SKIPPED")] if stack and stack != ANY else rows.iloc[0:0]
    chosen = chosen.sort_values(["compile_s", "peak_memory_bytes"], ascending=False, na_position="last").head(top)
    label = chosen["model"] + [f" ({d})" if d and d != "float32" else "" for d in chosen["dtype"].fillna("")]
    return pd.DataFrame({"model": label.to_numpy(), "compile_s": chosen["compile_s"].to_numpy(dtype=float),
                         "peak_mb": (chosen["peak_memory_bytes"].astype(float) / 2**20).to_numpy()})


def per_model_drift(snapshot: Snapshot, stack: str, top: int = 25) -> pd.DataFrame:
    """Per model on one stack, the worst relative logit difference (logit_max_rel_max) and lowest cosine
    similarity against the reference; the `top` largest drifts first. Rows without drift are left out."""
    rows = snapshot.rows
    chosen = rows[(rows["stack_id"] == stack) & rows["logit_max_rel_max"].notna()] if stack and stack != ANY else rows.iloc[0:0]
    chosen = chosen.sort_values("logit_max_rel_max", ascending=False).head(top)
    label = [f"{m} ({d})" if d and d != "float32" else str(m) for m, d in zip(chosen["model"], chosen["dtype"].fillna(""))]
    return pd.DataFrame({"model": label, "max_rel": chosen["logit_max_rel_max"].to_numpy(dtype=float),
                         "cosine_min": chosen["logit_cosine_min"].to_numpy(dtype=float), "status": chosen["status"].to_numpy()})


def model_drift(results: list[dict]) -> dict[str, list[float]]:
    """A model's per-step relative logit difference on each stack it has drift on: label -> one value per step."""
    return {_result_key_label(row): [float(v) for v in row["logit_max_rel"]] for row in results
            if row.get("logit_max_rel") is not None and len(row["logit_max_rel"])}


def status_summary() -> dict[str, str]:
    """What each shown status means, for the page's legend."""
    return {result_label(s): text for s, text in STATUSES.items()} | {NOT_TESTED: "no result recorded on that stack; not a failure"}
