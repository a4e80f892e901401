"""The catalog: which public models the app lists, with the Hub's popularity fields.

File format (JSON, `"format": "assay-catalog/1"`):

    {"format": "assay-catalog/1",
     "selected": ["Qwen/Qwen3-0.6B", ...],          # the maintainers' pick, in display order
     "models": [{"id": "Qwen/Qwen3-0.6B", "task": "text-generation", "downloads": 1234,
                 "likes": 56, "trending_score": 7, "library": "transformers"}, ...],
     "source": "hub" | "zoo" | "<file>", "refreshed_at": "2026-12-02T10:00:00+00:00"}

A built zoo's catalog.json (`{"format": 1, "entries": [{"name", "stands_in_for", "task", ...}]}`) is
accepted too: its stand-ins become the selected models. `refresh_catalog` fills the popularity
fields from the Hub's model listing (`HfApi().list_models`), or from a recorded response of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from assay.core.errors import AssayError

CATALOG_FORMAT = "assay-catalog/1"
RANKINGS = ("downloads", "trending_score")  # the Hub's sort keys behind the Downloads and Trending views

ListModels = Callable[..., Iterable[object]]  # HfApi().list_models or a recorded stand-in


@dataclass(frozen=True)
class CatalogModel:
    id: str
    task: str | None = None
    downloads: int | None = None
    likes: int | None = None
    trending_score: float | None = None
    library: str | None = None


@dataclass(frozen=True)
class Catalog:
    selected: tuple[str, ...] = ()
    models: tuple[CatalogModel, ...] = ()
    source: str = "empty"
    refreshed_at: str | None = None
    by_id: dict[str, CatalogModel] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {m.id: m for m in self.models})

    def as_dict(self) -> dict:
        return {
            "format": CATALOG_FORMAT, "selected": list(self.selected), "models": [asdict(m) for m in self.models],
            "source": self.source, "refreshed_at": self.refreshed_at,
        }


def _number(value, kind, where: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AssayError(f"{where}: expected a number, got {value!r}")
    return kind(value)


def catalog_from_dict(data: object, where: str = "catalog") -> Catalog:
    if not isinstance(data, dict):
        raise AssayError(f"{where} is not a catalog (expected a JSON object)")
    if "entries" in data and "models" not in data:
        return _from_zoo(data, where)
    if data.get("format") != CATALOG_FORMAT:
        raise AssayError(f"{where} is not a catalog (format {data.get('format')!r}, expected {CATALOG_FORMAT!r})")
    models = []
    for i, item in enumerate(data.get("models") or []):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise AssayError(f"{where}: models[{i}] has no string id")
        models.append(CatalogModel(
            id=item["id"], task=item.get("task"), downloads=_number(item.get("downloads"), int, f"{where}: {item['id']} downloads"),
            likes=_number(item.get("likes"), int, f"{where}: {item['id']} likes"),
            trending_score=_number(item.get("trending_score"), float, f"{where}: {item['id']} trending_score"),
            library=item.get("library"),
        ))
    selected = data.get("selected") or []
    if not isinstance(selected, list) or not all(isinstance(s, str) for s in selected):
        raise AssayError(f"{where}: selected must be a list of model ids")
    return Catalog(tuple(selected), tuple(models), str(data.get("source") or where), data.get("refreshed_at"))


def _from_zoo(data: dict, where: str) -> Catalog:
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("stands_in_for") for e in entries):
        raise AssayError(f"{where} is not a catalog (a zoo catalog's entries need stands_in_for)")
    return catalog_from_stand_ins(((e["stands_in_for"], e.get("task")) for e in entries), source="zoo")


def catalog_from_stand_ins(pairs: Iterable[tuple[str, str | None]], source: str = "zoo") -> Catalog:
    models: dict[str, CatalogModel] = {}
    for public_id, task in pairs:
        models.setdefault(public_id, CatalogModel(public_id, task))
    return Catalog(tuple(models), tuple(models.values()), source)


def zoo_catalog() -> Catalog:
    """The default pick: the public checkpoints the zoo's tiny models stand in for."""
    from assay.zoo.entries import ZOO

    return catalog_from_stand_ins((entry.stands_in_for, entry.task) for entry in ZOO.values())


def resolve_catalog(results: str | Path, path: str | Path | None = None) -> Catalog:
    """The catalog a command uses: the file given, else the results folder's catalog.json, else the zoo's stand-ins."""
    if path is not None:
        return load_catalog(path)
    beside = Path(results) / "catalog.json"
    return load_catalog(beside) if beside.is_file() else zoo_catalog()


def load_catalog(path: str | Path) -> Catalog:
    path = Path(path)
    if not path.is_file():
        raise AssayError(f"catalog file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AssayError(f"catalog file {path} is not valid JSON ({exc})") from None
    return catalog_from_dict(data, where=f"catalog file {path}")


def save_catalog(catalog: Catalog, path: str | Path) -> Path:
    from assay.core.files import atomic_write_json

    atomic_write_json(path, catalog.as_dict())
    return Path(path)


def model_from_listing(info: object, task: str) -> CatalogModel:
    """One `huggingface_hub.ModelInfo` (as list_models yields it) as a catalog entry."""
    return CatalogModel(
        id=info.id, task=getattr(info, "pipeline_tag", None) or task,
        downloads=getattr(info, "downloads", None), likes=getattr(info, "likes", None),
        trending_score=getattr(info, "trending_score", None), library=getattr(info, "library_name", None),
    )


def refresh_catalog(task: str, limit: int, list_models: ListModels | None = None, existing: Catalog | None = None) -> Catalog:
    """The top `limit` models of `task` by downloads and by trending score, merged into `existing`.

    Models of other tasks and the maintainers' selected list are kept; this task's models are replaced.
    """
    if limit < 1:
        raise AssayError("--limit must be at least 1")
    if list_models is None:
        from huggingface_hub import HfApi

        list_models = HfApi().list_models
    fetched: dict[str, CatalogModel] = {}
    for sort in RANKINGS:
        try:
            listing = list(list_models(pipeline_tag=task, sort=sort, limit=limit))
        except AssayError:
            raise
        except Exception as exc:  # offline, rate-limited, the Hub down: one line, not a traceback
            raise AssayError(f"could not list {task} models by {sort} from the Hub ({type(exc).__name__}: {exc})") from None
        for info in listing:
            model = model_from_listing(info, task)
            known = fetched.get(model.id)
            # The two listings can disagree by a few downloads between requests; keep the fields each has.
            fetched[model.id] = model if known is None else replace(
                known, **{k: v for k, v in asdict(model).items() if v is not None and getattr(known, k) is None}
            )
    base = existing or zoo_catalog()
    # The selected models stay listed even when they dropped out of this task's top `limit`.
    kept = [m for m in base.models if m.id not in fetched and ((m.task or task) != task or m.id in base.selected)]
    return Catalog(base.selected, tuple(kept + list(fetched.values())), "hub",
                   datetime.now(timezone.utc).isoformat(timespec="seconds"))


def recorded_list_models(path: str | Path) -> ListModels:
    """A list_models stand-in that answers from a recorded response file.

    The file holds the Hub API's JSON per request: {"requests": [{"pipeline_tag": ..., "sort": ...,
    "limit": ..., "response": [<model JSON as /api/models returns it>, ...]}]}. Each item becomes a
    real `huggingface_hub.ModelInfo`, as list_models builds it, so the same parsing code runs.
    """
    path = Path(path)
    try:
        recording = json.loads(path.read_text(encoding="utf-8"))
        requests = recording["requests"]
    except FileNotFoundError:
        raise AssayError(f"recorded response {path} does not exist") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise AssayError(f"recorded response {path} is not a list_models recording ({type(exc).__name__}: {exc})") from None

    def list_models(*, pipeline_tag: str, sort: str, limit: int) -> list:
        from huggingface_hub.hf_api import ModelInfo

        for request in requests:
            if request.get("pipeline_tag") == pipeline_tag and request.get("sort") == sort:
                return [ModelInfo(**({"siblings": None} | item)) for item in request["response"][:limit]]
        raise AssayError(f"recorded response {path} has no list_models(pipeline_tag={pipeline_tag!r}, sort={sort!r})")

    return list_models
