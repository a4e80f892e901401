"""The set-up scripts as a newcomer runs them: main.sh installs only what the main job needs, and each
step says what it is doing."""

from __future__ import annotations

import re
import subprocess

from helpers.cli import REPO

SCRIPTS = REPO / "scripts"


def test_setup_refuses_an_unknown_part_in_one_line():
    completed = subprocess.run(["bash", str(SCRIPTS / "setup.sh"), "everything"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2
    assert completed.stderr == "setup: unknown part 'everything' (main, tour or test)\n"


def test_the_main_job_installs_no_browser_and_no_test_extras():
    main = (SCRIPTS / "main.sh").read_text(encoding="utf-8")
    setup = (SCRIPTS / "setup.sh").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh main" in main and "chromium" not in main.lower()
    assert re.search(r'^\s*main\) EXTRAS="" ;;$', setup, re.MULTILINE)  # assay alone: no [test], no [app], ...
    assert "chromium" not in setup.lower() and "apt-get" not in setup
    # The browser for the web-app tests, and the test extras, come with the test suite's own script.
    test = (SCRIPTS / "test.sh").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh test" in test and "apt-get install" in test and "chromium" in test


def test_each_step_says_what_it_is_doing_and_pip_is_not_quiet():
    for name in ("setup.sh", "main.sh", "test.sh"):
        text = (SCRIPTS / name).read_text(encoding="utf-8")
        assert "--quiet" not in text and " -q " not in text.replace("apt-get update -qq", ""), name
    setup = (SCRIPTS / "setup.sh").read_text(encoding="utf-8")
    said = [line.split('"')[1] for line in setup.splitlines() if line.strip().startswith('step "')]
    assert {line[:4] for line in said} >= {"1/3 ", "2/3 ", "3/3 "} and any(line.startswith("creating") for line in said)
