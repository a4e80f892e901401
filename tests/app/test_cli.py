"""Bad input to `assay app` and `assay export-space` is one line on stderr and exit 2, before any server starts."""

from __future__ import annotations

import socket

from compat.test_dataset import make_row

from assay.compat.results.dataset import write_row


def _one_error_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_app_refuses_a_folder_that_is_not_a_results_folder(tmp_path, assay_cli):
    assert "is not a results folder" in _one_error_line(assay_cli("app", str(tmp_path / "missing")))
    (tmp_path / "notes.txt").write_text("hello")
    assert "no assay-results.json, no .parquet files" in _one_error_line(assay_cli("app", str(tmp_path)))


def test_app_refuses_a_bad_catalog_file(tmp_path, assay_cli):
    write_row(tmp_path / "results", make_row("a"))
    bad = tmp_path / "catalog.json"
    bad.write_text('{"format": "assay-catalog/1", "selected": "Qwen/Qwen3-0.6B"}')
    assert "selected must be a list of model ids" in _one_error_line(assay_cli("app", str(tmp_path / "results"), "--catalog", str(bad)))
    assert "does not exist" in _one_error_line(assay_cli("app", str(tmp_path / "results"), "--catalog", str(tmp_path / "nope.json")))


def test_app_refuses_a_port_in_use(tmp_path, assay_cli):
    write_row(tmp_path / "results", make_row("a"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_error_line(assay_cli("app", str(tmp_path / "results"), "--port", str(port)))
    assert f"cannot serve on 127.0.0.1:{port}" in line and "in use" in line


def test_export_space_refuses_a_folder_it_did_not_write(tmp_path, assay_cli):
    write_row(tmp_path / "results", make_row("a"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    line = _one_error_line(assay_cli("export-space", str(tmp_path / "mine"), "--results", str(tmp_path / "results")))
    assert "not empty and was not written by assay export-space" in line
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "keep me"
    assert "is not a results folder" in _one_error_line(assay_cli("export-space", str(tmp_path / "out"), "--results", str(tmp_path / "nope")))
