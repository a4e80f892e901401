"""Reading `recall train` results back, the table rows, and the two plots (accuracy vs pairs; needle heat-map)."""

from __future__ import annotations

import json
from pathlib import Path

from assay.core.errors import AssayError
from assay.recall.models import arch_label
from assay.recall.train import RESULTS_FILE, SCHEMA

TABLE_COLUMNS = ["arch", "seq_len", "pairs", "accuracy", "params", "state_bytes", "state_kind", "steps", "minutes", "wall_minutes",
                 "converged", "status"]
SWEEP_COLUMNS = ["arch", "dim", "heads", "expand_k", "pairs", "accuracy", "params", "state_bytes", "steps", "minutes", "converged", "status"]
TABLE_HEADERS = {"state_bytes": "state/KV bytes", "state_kind": "kind", "minutes": "CPU min", "wall_minutes": "wall min"}


def load_results(path: str | Path) -> dict:
    """results.json of a `recall train` folder (or the file itself)."""
    path = Path(path)
    file = path / RESULTS_FILE if path.is_dir() else path
    if not file.is_file():
        raise AssayError(f"no {RESULTS_FILE} in {path} (run `assay recall train --out {path}` first)")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise AssayError(f"{file} is not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise AssayError(f"{file} is not a `recall train` result (schema {SCHEMA})")
    return data


def _converged_cell(row: dict) -> str:
    if row.get("converged") is None:
        return "-"
    if not row["converged"]:
        return "no (budget)"
    return "yes (plateau)" if row.get("stopped_by") == "plateau" else "yes"


def table_rows(rows: list[dict]) -> list[dict]:
    """Rows for print_table: accuracy as a percentage, skipped cells with their reason."""
    shown = []
    for row in rows:
        shown.append(row | {
            "accuracy": f"{100 * row['accuracy']:.1f}%" if row.get("accuracy") is not None else "-",
            "minutes": round(row["minutes"], 2) if row.get("minutes") is not None else None,
            "wall_minutes": round(row["wall_minutes"], 2) if row.get("wall_minutes") is not None else None,
            # converged: reached --until-accuracy on validation, or stopped improving (--patience); "-" when neither was asked.
            "converged": _converged_cell(row),
            "state_bytes": f"{row['state_bytes']:,}",
            "status": row["status"] if row["status"] == "ok" else f"{row['status']}: {row.get('reason')}",
        })
    return shown


def plot_accuracy(rows: list[dict], out: str | Path, title: str = "MQAR accuracy vs key-value pairs", chance: float | None = None) -> Path:
    """Accuracy vs pairs (log x), one line per (architecture, seq_len); skipped cells are left out."""
    from assay.core.metrics import new_figure, save_figure

    fig, axes = new_figure(size=(7.0, 4.5))
    ax = axes[0][0]
    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("accuracy") is not None:
            series.setdefault((row["arch"], row["seq_len"]), []).append((row["pairs"], row["accuracy"]))
    if not series:
        raise AssayError("no scored rows to plot (every cell was skipped)")
    # Colour and marker by architecture, line style by length: the two comparisons read separately.
    colours, markers = {"gla": "tab:blue", "qwen3": "tab:red"}, {"gla": "o", "qwen3": "s"}
    line_styles = ["-", "--", ":", "-."]
    lengths = sorted({seq_len for _, seq_len in series})
    for (arch, seq_len), points in sorted(series.items()):
        points.sort()
        state = next(r for r in rows if r["arch"] == arch and r["seq_len"] == seq_len)
        label = f"{arch_label(arch)}, {seq_len} tokens ({_bytes(state['state_bytes'])} {state['state_kind']})"
        ax.plot([p for p, _ in points], [100 * a for _, a in points], color=colours.get(arch), marker=markers.get(arch, "^"),
                linestyle=line_styles[lengths.index(seq_len) % len(line_styles)], label=label)
    if chance:
        ax.axhline(100 * chance, color="grey", linestyle=":", linewidth=1, label=f"chance ({100 * chance:.2g}%)")
    ax.set_xscale("log", base=2)
    ticks = sorted({p for points in series.values() for p, _ in points})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("key-value pairs per sequence")
    ax.set_ylabel("recall accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_needle(result: dict, out: str | Path) -> Path:
    """Heat-map of needle accuracy: lengths (rows) x depths (columns); skipped cells grey and marked."""
    import numpy as np

    from assay.core.metrics import new_figure, save_figure

    lengths = sorted({c["length"] for c in result["cells"]})
    depths = sorted({c["depth"] for c in result["cells"]})
    by_cell = {(c["length"], c["depth"]): c for c in result["cells"]}
    grid = np.full((len(lengths), len(depths)), np.nan)
    fig, axes = new_figure(size=(1.2 * len(depths) + 2.5, 0.7 * len(lengths) + 2.0))
    ax = axes[0][0]
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            cell = by_cell.get((length, depth))
            if cell and cell.get("accuracy") is not None:
                grid[i, j] = 100 * cell["accuracy"]
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=9, color="black" if grid[i, j] > 50 else "white")
            else:
                ax.text(j, i, "skipped", ha="center", va="center", fontsize=7, color="dimgrey")
    cmap = _cmap()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(lengths)), [str(length) for length in lengths])
    ax.set_xlabel("needle depth (0 = start, 1 = just before the question)")
    ax.set_ylabel("prompt tokens")
    ax.set_title(f"needle ({result['format']}): {Path(result['model']).name} [{result['kind']}]", fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    return save_figure(fig, out)


def _cmap():
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
