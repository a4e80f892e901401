"""Compile caches carried by archive between machines of one stack; refused from another stack."""

import json
import tarfile

import pytest

from assay.core.compile_cache import MANIFEST, compiler_fingerprint


@pytest.mark.inductor
def test_sweep_with_an_imported_cache_hits_it(zoo_dir, tmp_path, assay_cli):
    model = str(zoo_dir / "gpt2")
    cold = assay_cli("sweep", model, "--backend", "inductor", "--new-tokens", "4", "--cache-dir", str(tmp_path / "cache-a"), "--out", str(tmp_path / "r1"), "--json")
    assert cold.returncode == 0, cold.stderr[-2000:]
    [cold_row] = json.loads(cold.stdout)["rows"]
    assert cold_row["status"] == "PASS" and cold_row["compile_cache_hit"] is False
    archive = tmp_path / "cache.tar.gz"
    exported = assay_cli("cache", "export", str(archive), "--cache-dir", str(tmp_path / "cache-a"), "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["files"] > 0
    # Another "machine": an empty cache folder, filled only from the archive.
    imported = assay_cli("cache", "import", str(archive), "--cache-dir", str(tmp_path / "cache-b"), "--json")
    assert imported.returncode == 0, imported.stderr
    warm = assay_cli("sweep", model, "--backend", "inductor", "--new-tokens", "4", "--cache-dir", str(tmp_path / "cache-b"), "--out", str(tmp_path / "r2"), "--json")
    [warm_row] = json.loads(warm.stdout)["rows"]
    assert warm_row["status"] == "PASS" and warm_row["compile_cache_hit"] is True
    assert warm_row["generated_tokens"] == cold_row["generated_tokens"]
    assert warm_row["compile_s"] < cold_row["compile_s"]


def _archive_with(tmp_path, fingerprint):
    archive = tmp_path / "foreign.tar.gz"
    data = json.dumps({"kind": "assay compile cache", "fingerprint": fingerprint, "files": 1}).encode()
    (tmp_path / "payload").write_text("compiled")
    with tarfile.open(archive, "w:gz") as tar:
        import io

        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.add(tmp_path / "payload", arcname="cache/payload")
    return archive


def test_import_refuses_a_cache_from_another_stack(tmp_path, assay_cli):
    foreign = compiler_fingerprint("cpu") | {"torch": "2.99.0"}
    result = assay_cli("cache", "import", str(_archive_with(tmp_path, foreign)), "--cache-dir", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "refusing a compile cache from another stack: torch 2.99.0" in result.stderr
    assert not (tmp_path / "c" / "payload").exists()


def test_import_accepts_the_same_stack_and_rejects_non_archives(tmp_path, assay_cli):
    result = assay_cli("cache", "import", str(_archive_with(tmp_path, compiler_fingerprint("cpu"))), "--cache-dir", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "c" / "payload").read_text() == "compiled"
    (tmp_path / "junk.tar.gz").write_bytes(b"junk")
    bad = assay_cli("cache", "import", str(tmp_path / "junk.tar.gz"))
    assert bad.returncode == 2 and "not an assay compile-cache archive" in bad.stderr
