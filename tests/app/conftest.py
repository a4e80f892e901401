"""Fixtures of the app's tests: a results folder, a served app in a subprocess, a headless Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from app.builders import mixed_rows, recorded_catalog, stop, wait_until_served

from assay.app.catalog import save_catalog
from assay.compat.results.dataset import write_rows
from assay.core.net import free_port


@pytest.fixture
def mixed_results(tmp_path) -> Path:
    folder = tmp_path / "results"
    write_rows(folder, mixed_rows())
    return folder


@pytest.fixture(scope="module")
def served_app(tmp_path_factory):
    """`assay app` over the mixed results with the recorded catalog, on a free loopback port."""
    folder = tmp_path_factory.mktemp("served") / "results"
    write_rows(folder, mixed_rows())
    catalog_file = save_catalog(recorded_catalog(), folder.parent / "catalog.json")
    port = free_port()
    log = folder.parent / "app.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "assay", "app", str(folder), "--catalog", str(catalog_file), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy(),
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_served(url, process, log)
        yield url
    finally:
        stop(process)


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    # Nothing may leave the machine: a request off loopback fails the test that made it.
    outside: list[str] = []
    context.route(lambda url: not url.startswith(("http://127.0.0.1", "data:", "blob:")),
                  lambda route: (outside.append(route.request.url), route.abort()))
    tab = context.new_page()
    yield tab
    context.close()
    assert not outside, f"the page requested addresses off this machine: {outside[:5]}"
