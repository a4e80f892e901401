"""The catalog file and its refresh from the Hub's listing (a recorded list_models response offline)."""

from __future__ import annotations

import json

import pytest
from app.builders import RECORDED

from assay.app.catalog import (
    CATALOG_FORMAT, Catalog, CatalogModel, load_catalog, recorded_list_models, refresh_catalog, resolve_catalog, save_catalog,
    zoo_catalog,
)
from assay.core.errors import AssayError


def test_the_default_catalog_selects_the_public_models_the_zoo_stands_in_for():
    catalog = zoo_catalog()
    assert "Qwen/Qwen3-0.6B" in catalog.selected and "openai-community/gpt2" in catalog.selected
    assert len(set(catalog.selected)) == len(catalog.selected) and catalog.by_id["Qwen/Qwen3-0.6B"].task == "text-generation"


def test_refresh_parses_the_recorded_listing_through_huggingface_hub_model_info():
    catalog = refresh_catalog("text-generation", 5, list_models=recorded_list_models(RECORDED), existing=zoo_catalog())
    gpt2 = catalog.by_id["openai-community/gpt2"]
    assert (gpt2.downloads, gpt2.likes, gpt2.trending_score, gpt2.library) == (11_800_000, 3100, 12, "transformers")
    assert catalog.by_id["example-org/hot-new-model"].trending_score == 310  # only in the trending listing
    assert catalog.selected == zoo_catalog().selected and catalog.source == "hub" and catalog.refreshed_at
    assert "google/gemma-2-2b" in catalog.by_id  # a selected model outside the top 5 stays listed


def test_refresh_calls_list_models_as_the_hub_client_is_called_and_keeps_other_tasks():
    calls = []

    def list_models(**kwargs):
        calls.append(kwargs)
        return recorded_list_models(RECORDED)(**kwargs)

    existing = Catalog(("a/vision",), (CatalogModel("a/vision", "image-text-to-text", downloads=7), CatalogModel("old/text", "text-generation", 1)))
    catalog = refresh_catalog("text-generation", 3, list_models=list_models, existing=existing)
    assert calls == [{"pipeline_tag": "text-generation", "sort": "downloads", "limit": 3},
                     {"pipeline_tag": "text-generation", "sort": "trending_score", "limit": 3}]
    assert "a/vision" in catalog.by_id and "old/text" not in catalog.by_id and len(catalog.models) == 1 + 4


def test_a_hub_that_cannot_be_reached_is_one_clear_error():
    def offline(**kwargs):
        raise ConnectionError("Network is unreachable")

    with pytest.raises(AssayError, match="could not list text-generation models by downloads from the Hub"):
        refresh_catalog("text-generation", 5, list_models=offline)


def test_a_catalog_round_trips_and_a_zoo_catalog_file_is_accepted(tmp_path):
    catalog = refresh_catalog("text-generation", 5, list_models=recorded_list_models(RECORDED), existing=zoo_catalog())
    path = save_catalog(catalog, tmp_path / "catalog.json")
    assert json.loads(path.read_text())["format"] == CATALOG_FORMAT
    again = load_catalog(path)
    assert again.selected == catalog.selected and again.models == catalog.models
    zoo_file = tmp_path / "zoo" / "catalog.json"
    zoo_file.parent.mkdir()
    zoo_file.write_text(json.dumps({"format": 1, "entries": [{"name": "qwen3", "stands_in_for": "Qwen/Qwen3-0.6B", "task": "text-generation"}]}))
    assert load_catalog(zoo_file).selected == ("Qwen/Qwen3-0.6B",)
    assert resolve_catalog(zoo_file.parent).selected == ("Qwen/Qwen3-0.6B",)  # a results folder's own catalog.json wins


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"format": "other"}', "format 'other'"),
    ('{"format": "assay-catalog/1", "models": [{"task": "x"}]}', "models\\[0\\] has no string id"),
    ('{"format": "assay-catalog/1", "models": [{"id": "a/b", "downloads": "many"}]}', "expected a number"),
])
def test_a_bad_catalog_file_is_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "catalog.json"
    path.write_text(text)
    with pytest.raises(AssayError, match=message):
        load_catalog(path)


def test_catalog_refresh_command_from_a_recorded_response(tmp_path, assay_cli):
    out = tmp_path / "catalog.json"
    result = assay_cli("catalog", "refresh", "--task", "text-generation", "--limit", "5", "--from-file", str(RECORDED), "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert [m["id"] for m in printed["models"]][:2] == ["openai-community/gpt2", "Qwen/Qwen2.5-0.5B"]
    assert load_catalog(out).by_id["Qwen/Qwen3-0.6B"].downloads == 8_700_000
    missing = assay_cli("catalog", "refresh", "--task", "image-text-to-text", "--from-file", str(RECORDED), "--out", str(out))
    assert missing.returncode == 2 and "has no list_models(pipeline_tag='image-text-to-text'" in missing.stderr
    assert load_catalog(out).by_id["Qwen/Qwen3-0.6B"].downloads == 8_700_000  # the failed refresh left the file as it was
