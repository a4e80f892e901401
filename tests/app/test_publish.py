"""`assay publish`: a results folder becomes a dataset repository folder that the Hub's own loaders open offline,
and that assay reads back through the same reader as a results folder."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pandas as pd
from app.builders import GPU, NEW, OLD, mixed_rows, recorded_catalog, stop, wait_until_served

from assay.app.catalog import save_catalog
from assay.app.results.model_page import model_page
from assay.app.results.snapshot import load_snapshot
from assay.app.publish import TAG
from assay.compat.results.dataset import CARD, card_front_matter, query, stack_files, write_rows
from assay.compat.results.schema import SCHEMA_VERSION, STATUSES
from assay.core.net import free_port

LOAD = """
import json, sys
from datasets import load_dataset
out, stacks = sys.argv[1], sys.argv[2:]
loaded = {}
for stack in stacks:
    by_card = load_dataset(out, name=stack, split="train")
    by_file = load_dataset("parquet", data_files={"train": f"{out}/data/{stack}.parquet"}, split="train")
    loaded[stack] = {"card": sorted(zip(by_card["model"], by_card["status"])), "file": sorted(zip(by_file["model"], by_file["status"])),
                     "tokens": by_card.features["generated_tokens"].__class__.__name__}
print(json.dumps(loaded))
"""


def _results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    write_rows(results, mixed_rows())
    save_catalog(recorded_catalog(), results / "catalog.json")
    return results


def _one_error_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _left_behind(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_the_published_folder_loads_with_datasets_offline_one_config_per_stack(tmp_path, assay_cli):
    results = _results(tmp_path)
    out = tmp_path / "dataset"
    done = assay_cli("publish", str(out), "--results", str(results), "--license", "apache-2.0", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["rows"] == 11 and {s["stack"] for s in record["stacks"]} == {OLD, NEW, GPU}
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted(p.name for p in results.glob("*.parquet"))

    front = card_front_matter(out / CARD)
    assert front["license"] == "apache-2.0" and TAG in front["tags"]
    assert [(c["config_name"], c["data_files"]) for c in front["configs"]] == [
        (stack, [{"split": "train", "path": f"data/{stack}.parquet"}]) for stack in sorted([OLD, NEW, GPU])]

    # The Hub's loaders, offline, with their own empty cache: by config name through the card, and by file.
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(out), NEW, GPU], capture_output=True, text=True, env=env, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    for stack, rows in json.loads(loaded.stdout).items():
        expected = sorted([r["model"], r["status"]] for r in query(results, stack=stack) if r["stack_id"] == stack)
        assert rows["card"] == expected and rows["file"] == expected and rows["tokens"] == "List"


def test_the_card_says_what_a_row_means_the_schema_version_and_each_stacks_versions(tmp_path, assay_cli):
    out = tmp_path / "dataset"
    assert assay_cli("publish", str(out), "--results", str(_results(tmp_path)), "--title", "CPU: two stacks").returncode == 0
    card = (out / CARD).read_text()
    body = card.split("\n---\n", 1)[1]
    assert body.startswith("\n# CPU: two stacks") and card_front_matter(out / CARD)["pretty_name"] == "CPU: two stacks"
    assert f"Schema version **{SCHEMA_VERSION}**" in body and "## What a row means" in body
    assert "not tested" in body and "(`model`, `dtype`)" in body
    assert all(f"| {status} | {meaning} |" in body for status, meaning in STATUSES.items())
    # One line per stack with its versions (torch, transformers, compiler), and the whole stack as JSON.
    line = next(line for line in body.splitlines() if line.startswith(f"| `{NEW}` |"))
    assert "| 5 | 1 | 4 | 0 |" in line and "2.14.0" in line and "5.25.0" in line and "torch 2.14.0, triton 3.9.0" in line
    assert '"transformers": "5.25.0"' in body and f"<summary><code>{GPU}</code></summary>" in body


@pytest.mark.slow
def test_the_app_reads_a_published_folder_and_a_snapshot_of_it_like_the_results(tmp_path, assay_cli):
    results = _results(tmp_path)
    out = tmp_path / "dataset"
    assert assay_cli("publish", str(out), "--results", str(results)).returncode == 0

    # A local snapshot as huggingface_hub lays it out: the files are links into a blob store, beside .gitattributes.
    snapshot = tmp_path / "hub" / "datasets--me--assay" / "snapshots" / "0123abcd"
    blobs = tmp_path / "hub" / "datasets--me--assay" / "blobs"
    blobs.mkdir(parents=True)
    for i, source in enumerate(sorted(p for p in out.rglob("*") if p.is_file())):
        blob = blobs / f"blob{i}"
        blob.write_bytes(source.read_bytes())
        link = snapshot / source.relative_to(out)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (snapshot / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")

    reference = load_snapshot(results).rows
    for folder in (out, snapshot):
        assert [p.name for p in stack_files(folder)] == [p.name for p in stack_files(results)]
        rows = load_snapshot(folder).rows
        pd.testing.assert_frame_equal(rows, reference)
        page = model_page(load_snapshot(folder), recorded_catalog(), "Qwen/Qwen3-0.6B")
        assert list(page.table["result"]) == ["PASS", "FAIL_RUN", "PASS"]
    listed = assay_cli("results", str(snapshot), "--status", "FAIL_RUN", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["model"] for r in json.loads(listed.stdout)) == ["assay-zoo/llama", "assay-zoo/qwen3"]

    # `assay app` serves the snapshot: its page carries the rows and the catalog the publish copied beside them.
    port, log = free_port(), tmp_path / "app.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "-m", "assay", "app", str(snapshot), "--port", str(port)],
                                   stdout=output, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_served(url, process, log)
        with urllib.request.urlopen(url + "config", timeout=10) as response:
            config = response.read().decode()
        assert "assay-zoo/qwen3" in config and NEW in config and "example-org/hot-new-model" in config
    finally:
        stop(process)


def test_publishing_again_replaces_the_folder_and_drops_a_removed_stack(tmp_path, assay_cli):
    results = _results(tmp_path)
    out = tmp_path / "dataset"
    assert assay_cli("publish", str(out), "--results", str(results)).returncode == 0
    (results / f"{OLD}.parquet").unlink()
    again = assay_cli("publish", str(out), "--results", str(results), "--json")
    assert again.returncode == 0, again.stderr
    assert [c["config_name"] for c in card_front_matter(out / CARD)["configs"]] == sorted([NEW, GPU])
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted([f"{NEW}.parquet", f"{GPU}.parquet"])
    assert _left_behind(tmp_path) == []  # the staging and the retired folder are gone


@pytest.mark.slow
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, assay_cli):
    results = _results(tmp_path)
    out = tmp_path / "dataset"
    assert "is not a results folder" in _one_error_line(assay_cli("publish", str(out), "--results", str(tmp_path / "missing")))

    corrupt = tmp_path / "corrupt"
    write_rows(corrupt, mixed_rows()[:2])
    (corrupt / f"{NEW}.parquet").write_bytes(b"PAR1 not really parquet")
    assert "is not a readable results file" in _one_error_line(assay_cli("publish", str(out), "--results", str(corrupt)))

    (tmp_path / "a-file").write_text("keep me")
    assert "exists and is not a folder" in _one_error_line(assay_cli("publish", str(tmp_path / "a-file"), "--results", str(results)))
    assert (tmp_path / "a-file").read_text() == "keep me"

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    assert "not written by assay publish" in _one_error_line(assay_cli("publish", str(tmp_path / "mine"), "--results", str(results)))
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["thesis.tex"]

    assert "not a Hub license id" in _one_error_line(assay_cli("publish", str(out), "--results", str(results), "--license", "My License"))
    no_token = {"HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf")}
    assert "needs a Hugging Face token" in _one_error_line(
        assay_cli("publish", str(out), "--results", str(results), "--push", "me/assay", env=no_token))
    assert not out.exists() and _left_behind(tmp_path) == []


def test_a_push_that_cannot_reach_the_hub_is_one_line_and_keeps_the_written_folder(tmp_path, assay_cli):
    # The upload itself needs the network: offline, huggingface_hub refuses the first request, and we say so.
    out = tmp_path / "dataset"
    env = {"HF_TOKEN": "hf_not_a_real_token", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    line = _one_error_line(assay_cli("publish", str(out), "--results", str(_results(tmp_path)), "--push", "me/assay", env=env))
    assert f"could not push {out} to me/assay (OfflineModeIsEnabled" in line
    assert (out / CARD).is_file() and len(list((out / "data").glob("*.parquet"))) == 3
