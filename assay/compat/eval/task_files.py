"""`--eval TASKS`: which lm-eval tasks a probe scores, checked before any model work.

TASKS is a comma-separated list; each entry is an embedded task's name (assay/compat/eval/tasks/, built
from text assay ships, offline), `embedded` for all of them, or the path of the user's own lm-eval task
YAML file (one task per file). Bad input (an unknown name, a missing file, a YAML without a `task`, lm-eval
not installed) is one line and exit 2. Nothing here imports lm_eval: a probe without --eval never does.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import zlib
from pathlib import Path

import yaml

from assay.core.errors import AssayError

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
EMBEDDED = ("assay_cloze", "assay_next_sentence")
ALL_EMBEDDED = "embedded"
LOADER = "data.py"  # the embedded tasks' dataset loader, beside their YAML files


def parse_eval_tasks(text: str | None) -> tuple[str, ...]:
    """--eval's value as the request's eval_tasks: embedded names, and absolute paths of YAML files."""
    if text is None:
        return ()
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if not entries:
        raise AssayError("--eval needs at least one task (embedded: " + ", ".join(EMBEDDED) + ")")
    return check_eval_tasks(tuple(task for entry in entries for task in (EMBEDDED if entry == ALL_EMBEDDED else [entry])))


def check_eval_tasks(specs: tuple[str, ...]) -> tuple[str, ...]:
    """Each spec an embedded name or a readable lm-eval task file (made absolute), once each; lm-eval
    installed. Called where the request enters (the command, plan_probe): before any model work."""
    tasks: list[str] = []
    for spec in specs:
        resolved = spec if spec in EMBEDDED else str(_user_task_file(spec))
        if resolved not in tasks:
            tasks.append(resolved)
    if tasks:
        check_lm_eval()
    return tuple(tasks)


def check_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise AssayError("--eval needs lm-evaluation-harness: pip install 'assay[eval]' (lm-eval with its hf extra)")


class _TaskYamlLoader(yaml.SafeLoader):
    """lm-eval's YAML with its `!function` tags read as plain strings: enough to find the task's name."""


_TaskYamlLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _user_task_file(entry: str) -> Path:
    path = Path(entry).expanduser()
    if not path.exists():
        hint = "" if path.suffix in (".yaml", ".yml") or "/" in entry else f" (embedded tasks: {', '.join(EMBEDDED)}, or {ALL_EMBEDDED})"
        raise AssayError(f"--eval {entry}: no such task{hint} and no such file")
    if not path.is_file() or path.suffix not in (".yaml", ".yml"):
        raise AssayError(f"--eval {entry}: an lm-eval task is a .yaml file")
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskYamlLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise AssayError(f"--eval {entry}: the YAML does not parse ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("task"), str):
        raise AssayError(f"--eval {entry}: not an lm-eval task file (no `task: NAME`; groups are not taken)")
    return path.resolve()


def task_file(spec: str) -> Path:
    """The YAML file of a request's eval task (an embedded name or a path)."""
    return TASKS_DIR / f"{spec}.yaml" if spec in EMBEDDED else Path(spec)


def task_names(specs: tuple[str, ...]) -> list[str]:
    """The lm-eval task names of the specs (the name inside a user's YAML file)."""
    return [spec if spec in EMBEDDED else yaml.load(Path(spec).read_text(encoding="utf-8"), Loader=_TaskYamlLoader)["task"]
            for spec in specs]


def embedded_files(specs: tuple[str, ...]) -> dict[str, str]:
    """The files run.py writes to reproduce the embedded tasks among `specs`: each YAML, its JSONL, the loader."""
    files: dict[str, str] = {}
    for spec in specs:
        if spec in EMBEDDED:
            config = TASKS_DIR / f"{spec}.yaml"
            data_file = yaml.load(config.read_text(encoding="utf-8"), Loader=_TaskYamlLoader)["dataset_kwargs"]["data_file"]
            for path in (config, TASKS_DIR / data_file, TASKS_DIR / LOADER):
                files[path.name] = path.read_text(encoding="utf-8")
    return files


def pack_files(files: dict[str, str]) -> str:
    """Files as one printable blob for run.py (JSON, zlib, base64 in lines of 100): the two embedded tasks
    are about 95 kB of text, 30 kB packed."""
    blob = base64.b64encode(zlib.compress(json.dumps(files, sort_keys=True).encode(), 9)).decode()
    return "\n".join(blob[i:i + 100] for i in range(0, len(blob), 100))
