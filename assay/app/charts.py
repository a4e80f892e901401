"""The app's charts as matplotlib figures: pass rate per stack, compile time and peak memory per model.

Figures are built with matplotlib.figure.Figure, not pyplot: pyplot keeps global state that
concurrent requests of a web server would share.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

WIDTH = 7.0


def _plain(labels) -> list[str]:
    # Matplotlib reads $...$ in a label as mathtext: a model name is shown as written, never parsed.
    return [str(label).replace("$", r"\$") for label in labels]


def _empty(title: str, message: str) -> Figure:
    fig = Figure(figsize=(WIDTH, 2.5))
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_axis_off()
    return fig


def pass_rate_figure(rates: pd.DataFrame) -> Figure:
    """rates: assay.app.results.analysis.pass_rates (skipped rows are neither passed nor tested)."""
    title = "pass rate per stack (skipped not counted)"
    rated = rates[rates["tested"] > 0]
    if rated.empty:
        return _empty(title, "no tested results")
    fig = Figure(figsize=(WIDTH, 0.9 + 0.45 * len(rated)), layout="constrained")
    ax = fig.add_subplot()
    percent = 100 * rated["pass rate"].astype(float)
    bars = ax.barh(_plain(rated["stack"]), percent, color="#3b8a4a")
    ax.bar_label(bars, labels=[f"{p:.0f}% ({n}/{t})" for p, n, t in zip(percent, rated["passed"], rated["tested"])], padding=3, fontsize=8)
    ax.set_xlim(0, 118)
    ax.set_xlabel("PASS / tested, %")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.tick_params(axis="y", labelsize=8)
    return fig


def _per_model(costs: pd.DataFrame, column: str, xlabel: str, title: str, color: str) -> Figure:
    shown = costs.dropna(subset=[column])
    if shown.empty:
        return _empty(title, "no results with this measurement on the chosen stack")
    fig = Figure(figsize=(WIDTH, 0.9 + 0.3 * len(shown)), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(_plain(shown["model"]), shown[column], color=color)
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def compile_time_figure(costs: pd.DataFrame, stack: str | None) -> Figure:
    return _per_model(costs, "compile_s", "seconds (compilation + first generate)", "compile time per model\n" + _plain([stack or ""])[0], "#4a6fa5")


def peak_memory_figure(costs: pd.DataFrame, stack: str | None) -> Figure:
    return _per_model(costs, "peak_mb", "MB", "peak memory per model\n" + _plain([stack or ""])[0], "#a5674a")


def drift_per_model_figure(drift: pd.DataFrame, stack: str | None) -> Figure:
    """drift: assay.app.results.analysis.per_model_drift. Log scale: a healthy compiler sits at float32 round-off
    (~1e-7 of the logits' scale), a broken one at 1e-1; both must be readable on one axis."""
    title = "logit drift per model (worst step, relative to the largest reference logit)\n" + _plain([stack or ""])[0]
    shown = drift[drift["max_rel"] > 0]
    if shown.empty:
        return _empty(title, "no logit drift recorded on the chosen stack")
    fig = Figure(figsize=(WIDTH, 0.9 + 0.3 * len(shown)), layout="constrained")
    ax = fig.add_subplot()
    colours = ["#3b8a4a" if status == "PASS" else "#b83b3b" for status in shown["status"]]
    ax.barh(_plain(shown["model"]), shown["max_rel"], color=colours)
    ax.set_xscale("log")
    ax.set_xlabel("max |logit - reference| / max |reference| (green: PASS, red: failed)")
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def model_drift_figure(drift: dict[str, list[float]], model: str) -> Figure:
    """drift: assay.app.results.analysis.model_drift, one line per stack: how the error grows over the generated steps."""
    title = f"logit drift per step: {_plain([model])[0]}"
    series = {label: values for label, values in drift.items() if any(v > 0 for v in values)}
    if not series:
        return _empty(title, "no logit drift recorded for this model")
    fig = Figure(figsize=(WIDTH, 3.2), layout="constrained")
    ax = fig.add_subplot()
    for label, values in series.items():
        steps = [i for i, v in enumerate(values) if v > 0]
        ax.plot(steps, [values[i] for i in steps], marker="o", markersize=3, label=_plain([label])[0])
    ax.set_yscale("log")
    ax.set_xlabel("generated token (step 0: the eager prefill)")
    ax.set_ylabel("max rel. logit difference")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return fig
