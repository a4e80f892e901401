"""`assay export-space` writes a folder that runs as-is: its app.py is started and its page fetched over loopback."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from app.builders import OLD, mixed_rows, recorded_catalog, stop, wait_until_served

from assay.app.catalog import load_catalog, save_catalog
from assay.compat.results.dataset import query, write_rows
from assay.core.net import free_port

VENDOR_CHECK = """
import sys
sys.path.insert(0, {space!r})
import assay, assay.app.ui
print(assay.__file__)
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def _front_matter(readme: str) -> dict[str, str]:
    head = readme.split("---\n")[1]
    return dict(line.split(": ", 1) for line in head.strip().splitlines())


@pytest.mark.slow
def test_the_exported_space_runs_as_is_offline_from_its_own_copy_of_the_app(tmp_path, assay_cli):
    results = tmp_path / "results"
    write_rows(results, mixed_rows())
    save_catalog(recorded_catalog(), results / "catalog.json")
    space = tmp_path / "space"
    exported = assay_cli("export-space", str(space), "--results", str(results), "--title", "assay: CPU stacks", "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["rows"] == 11

    front = _front_matter((space / "README.md").read_text())
    assert front["sdk"] == "gradio" and front["app_file"] == "app.py" and front["title"] == '"assay: CPU stacks"'
    assert front["sdk_version"].split(".")[0] == "6"
    requirements = (space / "requirements.txt").read_text().split()
    assert {r.split(">=")[0] for r in requirements} == {"gradio", "duckdb", "pyarrow", "pandas", "matplotlib"}
    assert len(query(space / "data")) == 11 and load_catalog(space / "data" / "catalog.json").by_id["example-org/hot-new-model"]

    port = free_port()
    log = tmp_path / "space.log"
    # -I: no PYTHONPATH, no user site, no current folder on sys.path; app.py puts its own folder first.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {
        "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-I", str(space / "app.py")], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # While it starts: the vendored package alone imports the whole app, without torch or transformers.
        check = subprocess.run([sys.executable, "-I", "-c", VENDOR_CHECK.format(space=str(space))], capture_output=True, text=True,
                               env=env, timeout=120)
        assert check.returncode == 0, check.stderr
        origin, heavy = check.stdout.strip().splitlines()
        assert origin == str(space / "assay" / "__init__.py") and heavy == "[]"

        url = f"http://127.0.0.1:{port}/"
        wait_until_served(url, process, log)
        with urllib.request.urlopen(url + "config", timeout=10) as response:
            config = response.read().decode()
        assert "assay-zoo/qwen3" in config and "not tested" in config and OLD in config
        with urllib.request.urlopen(url + "gradio_api/info", timeout=10) as response:
            assert json.loads(response.read())["named_endpoints"] == {}  # nothing offered as an API
        request = urllib.request.Request(url + "gradio_api/upload", data=b"x", method="POST")
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("an upload was accepted")
        except urllib.error.HTTPError as refused:
            assert refused.code == 403
    finally:
        stop(process)


def test_a_second_export_replaces_the_first_and_drops_removed_stacks(tmp_path, assay_cli):
    results = tmp_path / "results"
    write_rows(results, mixed_rows())
    save_catalog(recorded_catalog(), results / "catalog.json")
    space = tmp_path / "space"
    assert assay_cli("export-space", str(space), "--results", str(results)).returncode == 0
    assert len(list((space / "data").glob("*.parquet"))) == 3
    (results / f"{OLD}.parquet").unlink()
    again = assay_cli("export-space", str(space), "--results", str(results), "--json")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in (space / "data").glob("*.parquet")) == sorted(p.name for p in results.glob("*.parquet"))
    assert not list(space.rglob(".*.tmp"))  # every file was written through a temporary name and renamed
