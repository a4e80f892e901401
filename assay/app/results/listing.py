"""The Models tab: the views (the catalog's Selected, Trending and Downloads, and All results), the
filters and the search, and the listing table they give."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from assay.app.catalog import Catalog, CatalogModel
from assay.app.results.cells import cell_count, cell_megabytes, cell_number, cell_text
from assay.app.results.snapshot import Snapshot
from assay.app.results.status import ANY, ANY_FAILURE, NOT_TESTED, SKIPPED
from assay.compat.results.schema import FAILURES

SELECTED, TRENDING, DOWNLOADS, ALL_RESULTS = "Selected", "Trending", "Downloads", "All results"
VIEWS = (SELECTED, TRENDING, DOWNLOADS, ALL_RESULTS)
# What "tested on" says of a row whose tested name differs from the public id it stands in for (a zoo entry).
STAND_IN, THE_CHECKPOINT = "tiny stand-in", "the checkpoint itself"
# The browser gets at most this many rows: a 10,000-row table helps nobody and costs seconds to send.
DEFAULT_LIMIT = 500

LIST_COLUMNS = [
    "#", "model", "tested as", "tested on", "task", "result", "eval", "reason", "stack", "dtype", "device", "compiler", "transformers",
    "total s", "peak MB", "downloads", "likes", "trending",
]


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


def row_mask(rows: pd.DataFrame, filters: Filters) -> pd.Series:
    mask = pd.Series(True, index=rows.index)
    for column, wanted in (("compiler", filters.compiler), ("transformers", filters.transformers), ("device", filters.device),
                           ("task", filters.task), ("stack_id", filters.stack)):
        if wanted and wanted != ANY:
            mask &= rows[column] == wanted
    return mask


def text_mask(search: pd.Series, text: str) -> pd.Series:
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
    mask = row_mask(rows, filters) & text_mask(rows["search"], filters.text) & _status_mask(rows["result"], filters.status)
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
        tested = rows[row_mask(rows, filters)]
        matched = frame.merge(tested, how="left", on="public", sort=False)
        matched["result"] = matched["result"].astype(object).fillna(NOT_TESTED)
        matched["task"] = matched["task"].where(matched["task"].notna(), matched["catalog_task"])
        search = matched["public"].str.lower() + "\n" + matched["model"].fillna("").str.lower()
        matched = matched[text_mask(search, filters.text) & _status_mask(matched["result"], filters.status)]
    total = len(matched)
    table = _display(matched.head(limit))
    stand_ins = int(_stand_in(matched).sum())
    return Listing(table, total, _listing_note(view, catalog, total, len(table), len(snapshot.rows), stand_ins))


def _stand_in(matched: pd.DataFrame) -> pd.Series:
    """Rows that tested a zoo entry in place of the public checkpoint they are listed under."""
    return matched["model"].notna() & (matched["public"] != matched["model"])


def _tested_on(matched: pd.DataFrame) -> list[str]:
    return [STAND_IN if stand_in else THE_CHECKPOINT if tested else ""
            for stand_in, tested in zip(_stand_in(matched), matched["model"].notna())]


def _listing_note(view: str, catalog: Catalog, total: int, shown: int, recorded: int, stand_ins: int = 0) -> str:
    if view in (TRENDING, DOWNLOADS) and not any(
        getattr(m, "trending_score" if view == TRENDING else "downloads") is not None for m in catalog.models
    ):
        return f"The catalog has no {view.lower()} ranking: fill it with `assay catalog refresh --task text-generation`."
    if view == SELECTED and not catalog.selected:
        return "The catalog selects no models."
    if view == ALL_RESULTS and recorded == 0:
        return "No results recorded yet."
    shown_note = f"showing the first {shown:,} of {total:,} rows; search or filter to narrow" if shown < total else f"{total:,} rows"
    if not stand_ins:
        return f"{view}: {shown_note}."
    # Said plainly: a zoo result is about the architecture on that stack, not the named checkpoint's weights.
    which = "all of them" if stand_ins == total else f"{stand_ins:,} of them"
    return (f"{view}: {shown_note}; {which} tested a {STAND_IN} (a small model of the same architecture), not the named "
            "checkpoint: such a result says the architecture runs on that stack, not that the checkpoint itself was loaded.")


def _display(matched: pd.DataFrame) -> pd.DataFrame:
    columns = {
        "#": [cell_count(v) for v in matched["rank"]],
        "model": [cell_text(v) for v in matched["public"]],
        "tested as": [cell_text(v) for v in matched["model"]],
        "tested on": _tested_on(matched),
        "task": [cell_text(v) for v in matched["task"]],
        "result": [cell_text(v) for v in matched["result"]],
        "eval": [cell_text(v) for v in matched["eval"]],
        "reason": [cell_text(v) for v in matched["reason"]],
        "stack": [cell_text(v) for v in matched["stack_id"]],
        "dtype": [cell_text(v) for v in matched["dtype"]],
        "device": [cell_text(v) for v in matched["device"]],
        "compiler": [cell_text(v) for v in matched["compiler"]],
        "transformers": [cell_text(v) for v in matched["transformers"]],
        "total s": [cell_number(v) for v in matched["total_s"]],
        "peak MB": [cell_megabytes(v) for v in matched["peak_memory_bytes"]],
        "downloads": [cell_count(v) for v in matched["downloads"]],
        "likes": [cell_count(v) for v in matched["likes"]],
        "trending": [cell_number(v) for v in matched["trending"]],
    }
    return pd.DataFrame(columns, columns=LIST_COLUMNS, dtype=object)
