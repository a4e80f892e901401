"""A result's values as table cells: every cell a string, empty for a missing value."""

from __future__ import annotations

import pandas as pd


def cell_text(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    return str(value)


def cell_number(value, digits: int = 3) -> str:
    if value is None or pd.isna(value):
        return ""
    value = float(value)
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def cell_megabytes(value) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value) / 2**20:,.1f}"


def cell_count(value) -> str:
    return "" if value is None or pd.isna(value) else f"{int(value):,}"
