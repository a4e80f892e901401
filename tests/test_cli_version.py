"""The top of the `assay` command as a user meets it: `--version`, and a `--help` that says in one line
what each command is for, grouped by what the user is doing."""

from __future__ import annotations

import re
import tomllib

from helpers.cli import REPO, run_assay


def test_version_prints_the_package_version():
    completed = run_assay("--version")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == f"assay {declared}\n"


def test_every_command_has_a_user_line_and_a_group():
    from assay.cli import USER_HELP, _command_name, app

    registered = [_command_name(entry) for entry in [*app.registered_commands, *app.registered_groups]]
    # A new command without a line of its own would show up under "Other" with its developer docstring.
    assert sorted(registered) == sorted(USER_HELP)
    assert all(len(line) <= 62 for _, line in USER_HELP.values()), "a line that wraps in an 80-column terminal"


def test_help_lists_each_command_with_its_line():
    from assay.cli import USER_HELP

    completed = run_assay("--help", env={"COLUMNS": "100", "TERM": "dumb"})
    assert completed.returncode == 0, completed.stderr
    text = completed.stdout
    assert "--version" in text and "README.md" in text
    for name, (panel, line) in USER_HELP.items():
        assert re.search(rf"^\W*{re.escape(name)}\s+{re.escape(line)}", text, re.MULTILINE), f"{name}: {line!r} not in --help"
        assert panel in text
    assert "Other" not in text


def test_a_command_keeps_its_full_help():
    completed = run_assay("probe", "--help", env={"COLUMNS": "100", "TERM": "dumb"})
    assert completed.returncode == 0, completed.stderr
    # Its own description (the docstring), not the one-line summary of the listing.
    assert "static cache" in completed.stdout and "--backend" in completed.stdout
