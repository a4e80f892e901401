"""The results dataset: one Parquet file per stack, rows written atomically, read with DuckDB.

Two layouts are read through the same functions (`stack_files`): a results folder (the marker and
`<stack>.parquet` files side by side) and a published dataset folder (`assay publish`, or a local
snapshot of such a Hub dataset), whose README.md dataset card names each stack's file in its
`configs:` front matter.

A write takes the stack file's lock, reads the file, replaces the row with the same key, and writes
the whole file to a temporary name that is renamed over the old one: a crash or kill at any moment
leaves the previous complete file, never a torn one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from assay.compat.results.schema import COLUMNS, ROW_KEY, SCHEMA, SCHEMA_VERSION
from assay.core.errors import AssayError
from assay.core.files import atomic_path, atomic_write_json, remove_stale_temporaries, reporting_disk_full

MARKER = "assay-results.json"
CARD = "README.md"  # a dataset repository's card; its YAML front matter lists the configs and their files


def stack_file(folder: Path, stack_id: str) -> Path:
    return Path(folder) / f"{stack_id}.parquet"


def check_results_target(folder: str | Path) -> Path:
    """A folder results will be written into, checked before any work: not a file, and every stack file
    already in it readable (a write must read its stack's file, and would fail after the probe)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise AssayError(f"{folder} is not a folder")
    if folder.is_dir():
        check_stack_files(folder)
    return folder


def init_results(folder: str | Path) -> Path:
    folder = check_results_target(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MARKER).exists():
        atomic_write_json(folder / MARKER, {"kind": "assay results", "schema_version": SCHEMA_VERSION})
    return folder


def check_results(folder: str | Path) -> Path:
    """A results folder holds our marker or stack Parquet files, or a dataset card naming them; anything else is bad input."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AssayError(f"{folder} is not a results folder (it does not exist or is not a folder)")
    if not (folder / MARKER).exists() and not stack_files(folder):
        raise AssayError(f"{folder} is not a results folder (no {MARKER}, no .parquet files and no dataset card naming any)")
    check_stack_files(folder)
    return folder


def card_front_matter(card: Path) -> dict:
    """The YAML header of a README.md dataset card ({} when it has none)."""
    import yaml

    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        raise AssayError(f"{card}: the YAML front matter has no closing ---")
    try:
        header = yaml.safe_load(text[3:end])
    except yaml.YAMLError as exc:
        raise AssayError(f"{card}: the YAML front matter does not parse ({str(exc).splitlines()[0]})") from None
    return header if isinstance(header, dict) else {}


def _config_paths(data_files) -> list[str]:
    # The Hub's forms: "a.parquet", ["a.parquet", ...], [{"split": "train", "path": "a.parquet" | [...]}, ...]
    if isinstance(data_files, str):
        return [data_files]
    paths: list[str] = []
    for item in data_files if isinstance(data_files, list) else [data_files]:
        value = item.get("path") if isinstance(item, dict) else item
        paths += _config_paths(value) if isinstance(value, (str, list)) else []
    return paths


def card_configs(folder: Path) -> dict[str, list[Path]]:
    """config_name -> its Parquet files, from the folder's dataset card (patterns expanded); {} without a card."""
    card = Path(folder) / CARD
    if not card.is_file():
        return {}
    configs: dict[str, list[Path]] = {}
    for config in card_front_matter(card).get("configs") or []:
        if not isinstance(config, dict):
            continue
        files: list[Path] = []
        for pattern in _config_paths(config.get("data_files")):
            matched = sorted(folder.glob(pattern)) if any(c in pattern for c in "*?[") else [folder / pattern]
            for path in matched:
                if not path.is_file():
                    raise AssayError(f"{card} names {pattern} in config {config.get('config_name')!r}, which is missing")
                files.append(path)
        configs[str(config.get("config_name", "default"))] = [f for f in files if f.suffix == ".parquet"]
    return configs


def stack_files(folder: str | Path) -> list[Path]:
    """The stack Parquet files of a results folder or of a published dataset folder (its card's configs)."""
    folder = Path(folder)
    configs = card_configs(folder)
    if configs:
        return sorted({path for files in configs.values() for path in files})
    return sorted(folder.glob("*.parquet"))


def check_stack_files(folder: Path) -> list[Path]:
    """The one gate every reader of a results folder passes: each stack file's Parquet footer is read
    (cheap: metadata only), so a damaged file is named in one line instead of a reader's traceback."""
    files = stack_files(folder)
    for path in files:
        try:
            pq.read_schema(path)
        except (pa.ArrowException, OSError) as error:
            raise _unreadable(path, error) from None
    return files


def _unreadable(path: Path, error: BaseException) -> AssayError:
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return AssayError(f"{path} is not a readable results file ({detail}); move it out of the results folder")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _normalise(row: dict) -> dict:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"columns not in the schema: {sorted(unknown)}")
    return {name: row.get(name) for name in COLUMNS} | {"schema_version": SCHEMA_VERSION}


def read_stack_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise _unreadable(path, error) from None
    rows = table.to_pylist()
    return [{name: row.get(name) for name in COLUMNS} for row in rows]


def write_rows(folder: str | Path, rows: list[dict]) -> list[Path]:
    """Insert or replace rows (by model and dtype) in their stacks' files, atomically per file."""
    folder = init_results(folder)
    by_stack: dict[str, list[dict]] = {}
    for row in rows:
        row = _normalise(row)
        by_stack.setdefault(row["stack_id"], []).append(row)
    written = []
    for stack_id, new_rows in by_stack.items():
        path = stack_file(folder, stack_id)
        with _locked(path):
            # A writer killed before its rename left a temporary beside the file: nobody else can be
            # writing this stack's file while we hold its lock, so the leftovers are garbage.
            for leftover in folder.glob(f".{path.name}.*.tmp"):
                leftover.unlink(missing_ok=True)
            new_keys = {tuple(r[k] for k in ROW_KEY) for r in new_rows}
            kept = [r for r in read_stack_rows(path) if tuple(r[k] for k in ROW_KEY) not in new_keys]
            table = pa.Table.from_pylist(kept + new_rows, schema=SCHEMA)
            kept = f"{path} is as it was" if path.exists() else f"nothing written at {path}"
            with reporting_disk_full(f"results file {path}", kept=kept), atomic_path(path) as tmp:
                pq.write_table(table, tmp, compression="zstd")
        written.append(path)
    return written


def write_row(folder: str | Path, row: dict) -> Path:
    return write_rows(folder, [row])[0]


def recorded_keys(folder: str | Path, stack_id: str) -> set[tuple]:
    return set(recorded_evals(folder, stack_id))


def recorded_evals(folder: str | Path, stack_id: str) -> dict[tuple, set[tuple[str, int | None]]]:
    """The keys recorded for a stack, each with the eval tasks its row scored, as (task, eval_limit)
    pairs (empty without --eval; the limit None when every document was scored)."""
    path = stack_file(Path(folder), stack_id)
    return {tuple(r[k] for k in ROW_KEY): {(task, r.get("eval_limit")) for task in r.get("eval_tasks") or ()}
            for r in read_stack_rows(path)}


def clean_partial_writes(folder: str | Path) -> list[Path]:
    """Remove temporary files left by a write that was killed before its rename."""
    return remove_stale_temporaries(folder)


def connect(folder: str | Path):
    """A DuckDB connection with a `results` view over every stack file in the folder."""
    import duckdb

    folder = check_results(folder)
    connection = duckdb.connect()
    files = [str(p) for p in stack_files(folder)]
    if files:
        file_list = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        connection.execute(f"CREATE VIEW stack_files AS SELECT * FROM read_parquet([{file_list}], union_by_name=true)")
        # Older files lack the newer columns (schema 4's drift and repro): each reads as a typed null,
        # so every reader sees the current schema whatever version the files were written in.
        present = {name for name, *_ in connection.execute("DESCRIBE stack_files").fetchall()}
        selected = [f'"{f.name}"' if f.name in present else f'CAST(NULL AS {_duckdb_type(f.type)}) AS "{f.name}"' for f in SCHEMA]
        extra = [f'"{name}"' for name in sorted(present - set(COLUMNS))]
        connection.execute(f"CREATE VIEW results AS SELECT {', '.join(selected + extra)} FROM stack_files")
    else:
        # An empty results folder is valid: the view exists with the schema and no rows.
        connection.register("_empty", pa.Table.from_pylist([], schema=SCHEMA))
        connection.execute("CREATE VIEW results AS SELECT * FROM _empty")
    return connection


def _duckdb_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_list(arrow_type):
        return _duckdb_type(arrow_type.value_type) + "[]"
    names = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}
    return names[arrow_type]


def query(
    folder: str | Path, stack: str | None = None, status: str | None = None, model: str | None = None,
    columns: list[str] | None = None,
) -> list[dict]:
    """Rows matching the filters; `columns` selects fewer columns (run.py and tokens are large)."""
    import duckdb

    connection = connect(folder)
    clauses, params = [], []
    if stack:
        clauses.append("(stack_id = ? OR stack_id LIKE ?)")
        params += [stack, f"%{stack}%"]
    if status:
        clauses.append("status = ?")
        params.append(status.upper())
    if model:
        clauses.append("lower(model) LIKE ?")
        params.append(f"%{model.lower()}%")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    selected = ", ".join(f'"{c}"' for c in columns if c in COLUMNS) if columns else "*"
    try:
        cursor = connection.execute(f"SELECT {selected} FROM results {where} ORDER BY stack_id, model", params)
    except duckdb.Error as error:  # a file whose footer reads but whose pages do not
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise AssayError(f"cannot read the results in {folder}: {detail}") from None
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, values)) for values in cursor.fetchall()]


def versions(row: dict) -> dict:
    return json.loads(row["versions"]) if row.get("versions") else {}


def merge_results(out: str | Path, sources: list[str | Path]) -> dict[str, int]:
    """Merge result folders (e.g. from several machines) into `out`: one row per stack and key.

    When two folders hold the same model on the same stack, the later probe (started_at) wins.
    """
    newest: dict[tuple, dict] = {}
    for source in sources:
        folder = check_results(source)
        for path in stack_files(folder):
            for row in read_stack_rows(path):
                key = (row["stack_id"], *(row[k] for k in ROW_KEY))
                if key not in newest or (row.get("started_at") or "") >= (newest[key].get("started_at") or ""):
                    newest[key] = row
    write_rows(out, list(newest.values())) if newest else init_results(out)
    per_stack: dict[str, int] = {}
    for stack_id, *_ in newest:
        per_stack[stack_id] = per_stack.get(stack_id, 0) + 1
    return per_stack
