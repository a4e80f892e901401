"""Statuses as the app shows them, their colours, and the versions a row's stack names.

A recorded status (PASS, FAIL_*, OOM, TIMEOUT, CRASH), "skipped" for a deliberate SKIPPED, and "not
tested" for a catalog model with no row: the last two never count as failures.
"""

from __future__ import annotations

import json
from functools import lru_cache

from assay.compat.results.schema import STATUSES

ANY = "any"
NOT_TESTED = "not tested"
SKIPPED = "skipped"
ANY_FAILURE = "any failure"


@lru_cache(maxsize=1024)
def parsed_versions(versions_json: str | None) -> tuple[str, str]:
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
    """pass, failure, abnormal or neutral for a shown status, or an eval's ("AGREE 1.00", "DISAGREE 0.87",
    "FAIL"); None for any other text."""
    if label == "PASS" or label.startswith("AGREE"):
        return "pass"
    if label.startswith(("FAIL", "DISAGREE")):
        return "failure"
    if label in ("TIMEOUT", "OOM", "CRASH"):
        return "abnormal"
    if label in (SKIPPED, NOT_TESTED, "SKIPPED"):
        return "neutral"
    return None


def status_style(label) -> str:
    kind = status_kind(label) if isinstance(label, str) else None
    return STATUS_COLOURS[kind] if kind else ""


def status_summary() -> dict[str, str]:
    """What each shown status means, for the page's legend."""
    return {result_label(s): text for s, text in STATUSES.items()} | {NOT_TESTED: "no result recorded on that stack; not a failure"}
