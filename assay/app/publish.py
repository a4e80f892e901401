"""`assay publish`: a results folder as a Hugging Face dataset repository folder.

The folder the Hub's tools open as it is: one Parquet file per stack under data/, and a README.md
dataset card whose YAML front matter has one `configs:` entry per stack, so that
`datasets.load_dataset(OUT, name=STACK)` (or the Hub's viewer) reads that stack's rows. The same
card is how assay reads the folder back (assay.compat.results.dataset.stack_files): `assay app OUT`,
`assay results OUT` and `assay diff OUT` work on a published folder or a local snapshot of one.

The folder is built beside OUT and renamed into place (assay.core.files.atomic_folder): a reader
sees the previous publication or the new one. `push` is a thin call to huggingface_hub.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import assay
from assay.app.catalog import resolve_catalog, save_catalog
from assay.app.results.status import compiler_version, transformers_version
from assay.compat.results.dataset import CARD, card_front_matter, check_results, stack_files
from assay.compat.results.schema import SCHEMA, SCHEMA_VERSION, STATUSES
from assay.core.errors import AssayError
from assay.core.files import atomic_folder, atomic_path, atomic_write_text

DATA = "data"
SPLIT = "train"  # the Hub's loaders want a split name; a stack's rows are one split
TAG = "assay-results"  # marks a card this command wrote, so a second publish may replace the folder
CATALOG = "catalog.json"
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")  # the Hub's license ids: apache-2.0, cc-by-4.0, other, ...

# What a row means: docs/dataset.md, in the words a dataset card reader needs.
ROW_MEANING = """\
Each row is one model probed on one stack (device, torch.compile backend, compiler and library
versions) in one dtype: `assay probe` loaded it with `from_pretrained`, compiled it, generated
`new_tokens` greedy tokens from a fixed prompt, and compared them with a CPU eager run of the same
checkpoint and dtype (`check` = `tokens-vs-cpu-eager`; sharded runs are judged for fluent text,
`check` = `judge`). A row's key is (`model`, `dtype`) within its stack; probing again replaces it.

A row holds only for the stack that produced it. A PASS says that greedy decoding matched the
reference for that prompt; it says nothing about throughput, long generations, sampling or other
prompts. `total_s` includes compilation; `peak_memory_bytes` is the device allocator's peak (on CPU
the probe process's peak resident set); `run_py` is the self-contained script that reproduces the
row; `versions` is the whole stack as JSON. A model with no row on a stack was **not tested**, and a
SKIPPED row was deliberately not run: neither is a failure."""


@dataclass(frozen=True)
class StackSummary:
    stack_id: str  # also the config name
    path: str  # relative to the published folder
    rows: int
    passed: int
    failed: int
    skipped: int
    device: str
    backend: str
    python: str
    torch: str
    transformers: str
    compiler: str
    versions: dict  # the whole stack, as recorded in its rows


@dataclass(frozen=True)
class Publication:
    folder: Path
    stacks: list[StackSummary]
    rows: int
    files: list[str]  # relative to the folder
    pushed: str | None = None  # the commit URL on the Hub


def check_out(out: Path) -> None:
    """OUT may be new, an empty folder, or a folder a previous `assay publish` wrote; nothing else."""
    if out.exists() and not out.is_dir():
        raise AssayError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not _published_before(out):
        raise AssayError(f"{out} is not empty and was not written by assay publish: choose a new or empty folder")


def _published_before(folder: Path) -> bool:
    if not (folder / CARD).is_file():
        return False
    try:
        tags = card_front_matter(folder / CARD).get("tags") or []
    except AssayError:
        return False
    return isinstance(tags, list) and TAG in tags


def check_license(license_id: str) -> str:
    if not LICENSE_ID.match(license_id or ""):
        raise AssayError(f"--license {license_id!r} is not a Hub license id (e.g. cc-by-4.0, apache-2.0, mit, other)")
    return license_id


def _summarise(path: Path) -> StackSummary:
    import pyarrow as pa
    import pyarrow.parquet as pq

    needed = ["stack_id", "status", "device", "device_name", "backend", "versions"]
    try:
        table = pq.read_table(path, columns=[c for c in needed if c in pq.read_schema(path).names])
    except (pa.ArrowException, OSError) as exc:
        raise AssayError(f"{path} is not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    missing = {"stack_id", "status"} - set(table.column_names)
    if missing:
        raise AssayError(f"{path} is not an assay stack file (no {', '.join(sorted(missing))} column)")
    rows = table.to_pylist()
    statuses = [r["status"] for r in rows]
    first = rows[0] if rows else {}
    try:
        versions = json.loads(first.get("versions") or "{}")
    except json.JSONDecodeError:
        versions = {}
    libraries = versions.get("libraries") if isinstance(versions.get("libraries"), dict) else {}
    return StackSummary(
        stack_id=path.stem, path=f"{DATA}/{path.name}", rows=len(rows), passed=statuses.count("PASS"),
        failed=sum(s not in ("PASS", "SKIPPED") for s in statuses), skipped=statuses.count("SKIPPED"),
        device=str(first.get("device_name") or first.get("device") or "?"), backend=str(first.get("backend") or "?"),
        python=str(versions.get("python") or "?"), torch=str(libraries.get("torch") or "?"),
        transformers=transformers_version(versions), compiler=compiler_version(versions), versions=versions,
    )


def _yaml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string: quotes and colons in a stack id stay literal


def dataset_card(stacks: list[StackSummary], license_id: str, title: str) -> str:
    configs = "\n".join(
        f"- config_name: {_yaml_string(s.stack_id)}\n  data_files:\n  - split: {SPLIT}\n    path: {_yaml_string(s.path)}"
        for s in stacks
    )
    total = sum(s.rows for s in stacks)
    size = "n<1K" if total < 1000 else "1K<n<10K" if total < 10_000 else "10K<n<100K" if total < 100_000 else "100K<n<1M"
    table = "\n".join(
        f"| `{s.stack_id}` | {s.rows} | {s.passed} | {s.failed} | {s.skipped} | {s.device} | {s.backend} | {s.python} | "
        f"{s.torch} | {s.transformers} | {s.compiler} |" for s in stacks
    )
    versions = "\n\n".join(
        f"<details><summary><code>{s.stack_id}</code></summary>\n\n```json\n{json.dumps(s.versions, indent=2, sort_keys=True)}\n```\n</details>"
        for s in stacks
    )
    statuses = "\n".join(f"| {status} | {meaning} |" for status, meaning in STATUSES.items())
    columns = ", ".join(f"`{field.name}` ({field.type})" for field in SCHEMA)
    first = stacks[0].stack_id if stacks else "STACK"
    return f"""---
license: {license_id}
pretty_name: {_yaml_string(title)}
tags:
- {TAG}
- pytorch
- torch-compile
size_categories:
- {size}
configs:
{configs}
---

# {title}

Which models run on which PyTorch stack: results of `assay probe` / `assay sweep`, one Parquet file
(one config) per stack. Schema version **{SCHEMA_VERSION}**; {total} rows over {len(stacks)} stacks;
written by assay {assay.__version__}.

```python
from datasets import load_dataset
rows = load_dataset("<this repository or folder>", name="{first}", split="{SPLIT}")
```

## What a row means
{ROW_MEANING}

| status | meaning |
| --- | --- |
{statuses}

Columns: {columns}.

## Stacks
| stack (config) | rows | PASS | failed | skipped | device | backend | python | torch | transformers | compiler |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}

The whole stack of each (every recorded version):

{versions}
"""


def publish(out: str | Path, results: str | Path, catalog_path: str | Path | None = None, license_id: str = "cc-by-4.0",
            title: str = "assay results") -> Publication:
    """Write OUT as a dataset repository folder of the results (atomically: built beside OUT, then renamed)."""
    out, results = Path(out), check_results(results)
    check_license(license_id)
    check_out(out)
    sources = stack_files(results)
    if not sources:
        raise AssayError(f"{results} holds no stack files to publish")
    if len({p.stem for p in sources}) < len(sources):
        raise AssayError(f"{results}: two stack files share a name; publish needs one file per stack")
    for path in sources:  # every file is read before anything is written: bad input leaves nothing behind
        _summarise(path)
    catalog = resolve_catalog(results, catalog_path)
    title = " ".join(title.split())
    with atomic_folder(out) as staging:
        for source in sources:
            with atomic_path(staging / DATA / source.name) as tmp:
                shutil.copyfile(source, tmp)
        # The card describes the copies, not the sources: a sweep still writing RESULTS cannot make them disagree.
        stacks = [_summarise(staging / DATA / source.name) for source in sources]
        save_catalog(catalog, staging / CATALOG)
        atomic_write_text(staging / CARD, dataset_card(stacks, license_id, title))
    files = [s.path for s in stacks] + [CATALOG, CARD]
    return Publication(out, stacks, sum(s.rows for s in stacks), files)


def check_push(repo_id: str) -> str:
    """The token `--push` will use (HF_TOKEN, or a saved login); refused before anything is written."""
    from huggingface_hub import get_token

    if not re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", repo_id or ""):
        raise AssayError(f"--push {repo_id!r} is not a repository id (owner/name)")
    token = get_token()
    if not token:
        raise AssayError("--push needs a Hugging Face token: set HF_TOKEN (or run `hf auth login`)")
    return token


def push(folder: Path, repo_id: str, token: str, private: bool = False) -> str:
    """Upload the published folder as a dataset repository: create it if needed, one commit of the whole folder."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=folder,
                                   commit_message=f"assay publish: {folder.name}")
    except Exception as exc:  # offline, no rights, the Hub down: one line; the folder stays written
        raise AssayError(f"could not push {folder} to {repo_id} ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    return str(getattr(commit, "commit_url", commit))
