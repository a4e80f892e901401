"""The reference cache: a second probe takes the CPU eager reference from it; keys follow content; a
corrupt or partial entry is never trusted; concurrent writers leave whole entries."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from assay.compat.probe.execute import probe
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.probe.reference_cache import ReferenceCache, default_root, reference_key

REPO = Path(__file__).resolve().parents[2]


def _request(zoo_dir, cache, model="qwen3", **kwargs):
    return ProbeRequest(str(zoo_dir / model), backend="eager", new_tokens=4, reference_cache=str(cache) if cache else None, **kwargs)


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.json"))


def test_second_probe_takes_the_reference_from_the_cache_with_phases(zoo_dir, tmp_path):
    cache = tmp_path / "refs"
    first = probe(_request(zoo_dir, cache))
    assert first["status"] == "PASS" and first["reference_cache_hit"] is False
    [entry] = _entries(cache)
    second = probe(_request(zoo_dir, cache))
    assert second["status"] == "PASS" and second["reference_cache_hit"] is True
    assert second["reference_tokens"] == first["reference_tokens"] == second["generated_tokens"]
    assert _entries(cache) == [entry]
    for row in (first, second):
        # The first compiled generate splits into three phases that add up to it (first_call_s is the rest).
        assert row["trace_s"] > 0 and row["backend_compile_s"] >= 0 and row["first_call_s"] >= 0
        assert row["trace_s"] + row["backend_compile_s"] + row["first_call_s"] == pytest.approx(row["compile_s"], rel=1e-9)
        assert row["generate_s"] > 0 and row["decode_tokens_per_s"] == pytest.approx(4 / row["generate_s"])
        assert row["reference_s"] > 0 and row["total_s"] >= row["load_s"] + row["compile_s"] + row["generate_s"]


@pytest.mark.slow
def test_the_cached_reference_is_what_the_tokens_are_compared_with(zoo_dir, tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    request = _request(zoo_dir, cache.root)
    first = probe(request)
    key = reference_key(plan_probe(request))
    tokens, top5 = cache.load(key, 4)
    # A whole, checksummed entry that says otherwise: the probe must believe it (it runs no reference).
    cache.store(key, tokens[:2] + [tokens[2] + 1] + tokens[3:], top5, "edited")
    second = probe(request)
    assert first["status"] == "PASS"
    assert second["reference_cache_hit"] is True and second["status"] == "FAIL_ACCURACY" and second["first_mismatch"] == 2


@pytest.mark.parametrize("damage", ["truncated", "token edited without its checksum", "too few steps", "not json"])
def test_a_corrupt_or_partial_entry_is_a_miss(zoo_dir, tmp_path, damage):
    cache = ReferenceCache(tmp_path / "refs")
    key = reference_key(plan_probe(_request(zoo_dir, cache.root)))
    cache.store(key, [1, 2, 3, 4], [[1, 5, 6, 7, 8], [2, 5, 6, 7, 8], [3, 5, 6, 7, 8], [4, 5, 6, 7, 8]], "x")
    assert cache.load(key, 4) is not None
    path = cache.path(key)
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif damage == "token edited without its checksum":
        entry["tokens"][1] = 9
        path.write_text(json.dumps(entry))
    elif damage == "too few steps":
        entry["tokens"], entry["top5"] = entry["tokens"][:3], entry["top5"][:3]
        path.write_text(json.dumps(entry))
    else:
        path.write_bytes(b"\x00\xff garbage")
    assert cache.load(key, 4) is None


def test_a_corrupt_entry_is_rewritten_by_the_next_probe(zoo_dir, tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    request = _request(zoo_dir, cache.root, model="llama")
    key = reference_key(plan_probe(request))
    cache.path(key).parent.mkdir(parents=True)
    cache.path(key).write_text('{"format": 1, "key": "')  # what a writer killed mid-write would leave without the rename
    row = probe(request)
    assert row["status"] == "PASS" and row["reference_cache_hit"] is False
    loaded = cache.load(key, 4)
    assert loaded is not None and loaded[0] == row["reference_tokens"]


def test_the_key_follows_checkpoint_content_and_request_not_the_path(zoo_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(zoo_dir / "qwen3", a)
    shutil.copytree(zoo_dir / "qwen3", b)

    def key(folder, **changes):
        return reference_key(plan_probe(replace(ProbeRequest(str(folder), backend="eager"), **changes)))

    assert key(a) == key(b) == key(zoo_dir / "qwen3")  # the same bytes in another folder
    assert len({key(a), key(a, dtype="bfloat16"), key(a, new_tokens=5), key(zoo_dir / "llama")}) == 4
    weights = next(b.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight, same size, same header
    weights.write_bytes(bytes(data))
    assert key(b) != key(a)
    (a / "tokenizer_config.json").write_text((a / "tokenizer_config.json").read_text() + " ")
    assert key(a) != key(zoo_dir / "qwen3")  # the tokenizer decides the prompt's tokens: part of the key


def test_default_location_follows_xdg_and_tests_never_share_the_user_cache(monkeypatch, tmp_path):
    assert Path(os.environ["XDG_CACHE_HOME"]) != Path.home() / ".cache"  # tests/conftest.py isolates it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root() == tmp_path / "assay" / "references"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_root() == Path.home() / ".cache" / "assay" / "references"


def test_without_the_cache_nothing_is_read_or_written(zoo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    row = probe(_request(zoo_dir, None, model="llama"))
    assert row["status"] == "PASS" and row["reference_cache_hit"] is None and row["reference_s"] > 0
    assert not (tmp_path / "xdg").exists()


WRITER = """
import sys
from assay.compat.probe.reference_cache import ReferenceCache
cache, tag = ReferenceCache(sys.argv[1]), int(sys.argv[2])
for i in range(200):
    cache.store("ab" * 32, [tag] * 64, [[tag, 1, 2, 3, 4]] * 64, "writer")
"""


def test_concurrent_writers_leave_a_whole_entry_at_every_moment(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(cache.root), str(tag)], env=env) for tag in (7, 8)]
    seen = set()
    while any(w.poll() is None for w in writers):
        if cache.path("ab" * 32).exists():
            loaded = cache.load("ab" * 32, 64)
            assert loaded is not None  # never half an entry: each write is a rename
            seen.add(loaded[0][0])
    assert all(w.returncode == 0 for w in writers)
    assert cache.load("ab" * 32, 64)[0][0] in (7, 8) and seen <= {7, 8}
    assert not list(cache.root.rglob("*.tmp"))


@pytest.mark.slow
def test_cli_flags_choose_the_folder_and_exclude_each_other(zoo_dir, tmp_path, assay_cli):
    refs = tmp_path / "refs"
    result = assay_cli("probe", str(zoo_dir / "gpt2"), "--backend", "eager", "--new-tokens", "3", "--out", str(tmp_path / "r"),
                       "--reference-cache", str(refs), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reference_cache_hit"] is False and len(_entries(refs)) == 1
    both = assay_cli("probe", str(zoo_dir / "gpt2"), "--reference-cache", str(refs), "--no-reference-cache", "--out", str(tmp_path / "r2"))
    assert both.returncode == 2 and "exclude each other" in both.stderr and "Traceback" not in both.stderr
    assert not (tmp_path / "r2").exists()
