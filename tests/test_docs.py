"""The documents speak to users: README.md and docs/ name no internal history (sessions, issue numbers,
must-haves, unnamed references), every repository path they cite exists, and the MkDocs site builds with
--strict (a broken link or a missing page fails)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Words a user cannot follow: the project's own history and bookkeeping, never the product.
INTERNAL = re.compile(
    r"\bsession[- ]\d+|\b(?:this|same|first|second|third|earlier|previous|loaded|other) sessions?\b"
    r"|\bissues?\s*#?\d+|(?<!\w)#\d+\b|\bthe issue\b|\bissue's\b|\bmust[- ]haves?\b|\bhelpers?\b(?!\.)"
    r"|\bthe reference system\b|\bshared/context\b",
    re.IGNORECASE,
)
# A path inside this repository: starts at one of its top-level folders. Braces list alternatives
# (`recall_needle_{qwen3,gla}.png`); placeholders (`<arch>`, `*`) name no single file and are left alone.
TOP_LEVEL = ("assay", "bench", "tests", "docs", "scripts", ".ci")
CITED = re.compile(r"(?<![\w./~-])((?:%s)/[\w./{},*<>-]*)" % "|".join(re.escape(name) for name in TOP_LEVEL))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _lines():
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            yield document, number, line


def _expand(path: str) -> list[str]:
    braces = re.search(r"\{([^{}]*)\}", path)
    if braces is None:
        return [path]
    return [done for alternative in braces.group(1).split(",")
            for done in _expand(path[:braces.start()] + alternative + path[braces.end():])]


def internal_references(lines) -> list[str]:
    return [f"{document.relative_to(REPO)}:{number}: {match.group(0)!r}"
            for document, number, line in lines for match in INTERNAL.finditer(line)]


def missing_citations(lines) -> list[str]:
    missing = []
    for document, number, line in lines:
        cited = [match.group(1).rstrip(".,:;") for match in CITED.finditer(line)]
        cited += [(document.parent / target).resolve().relative_to(REPO).as_posix()
                  for target in LINK.findall(line) if "://" not in target and not target.startswith("mailto:")
                  and (document.parent / target).resolve().is_relative_to(REPO)]
        for path in dict.fromkeys(cited):  # a link's target is also matched as a path
            if any(mark in path for mark in "*<>"):
                continue
            missing += [f"{document.relative_to(REPO)}:{number}: {each}" for each in _expand(path) if not (REPO / each).exists()]
    return missing


def test_documents_name_no_internal_history():
    found = internal_references(_lines())
    assert not found, "internal references a user cannot follow:\n" + "\n".join(found)


def test_every_cited_repository_path_exists():
    found = missing_citations(_lines())
    assert not found, "cited paths that are not in the repository:\n" + "\n".join(found)


def test_the_checks_catch_what_they_are_for():
    # The two scanners above pass on the real documents; here each must flag a planted line.
    planted = [(REPO / "docs" / "serve.md", 1, line) for line in (
        "measured in session 4", "issue 19's must-have 1 is met", "as the reference system found",
        "see `shared/context/fixed-state.md`", "the helper's run", "fixed by #38",
    )]
    assert all(internal_references([line]) for line in planted)
    clean = (REPO / "README.md", 1, "item `assay_cloze#63`; each probe is its own process and session; "
             "ASSAY_PLUGINS=helpers.misbehaving_backends")
    assert internal_references([clean]) == []
    cited = [(REPO / "README.md", 1, "run `bench/no_such_script.py`, see [it](docs/no_such_page.md)"),
             (REPO / "README.md", 2, "`bench/results/gla_{gates,no_such}.json`"),
             (REPO / "README.md", 3, "`assay/cli.py`, [the app](docs/app.md#the-views), `assay/models/<arch>/`")]
    assert [entry.split(": ", 1)[1] for entry in missing_citations(cited)] == [
        "bench/no_such_script.py", "docs/no_such_page.md", "bench/results/gla_no_such.json"]


def test_readme_is_a_short_guide():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (a guide of at most 250)"
    cells = [cell for line in lines if line.startswith("|") for cell in line.split("|")]
    assert max(map(len, cells), default=0) <= 200, "a README table cell over 200 characters"


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def _copy_of_the_docs(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy2(REPO / name, root / name)
    return root


@pytest.mark.slow
def test_the_docs_site_builds_strict(tmp_path):
    completed = _build(REPO, tmp_path / "site")
    assert completed.returncode == 0, completed.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    # The home page is README.md, its docs/ links pointing at the site's pages.
    assert "bash scripts/main.sh" in home and 'href="serve/"' in home


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["link", "nav"])
def test_the_strict_build_fails_on_a_broken_link_or_a_missing_page(tmp_path, plant):
    root = _copy_of_the_docs(tmp_path)
    if plant == "link":
        with (root / "docs" / "serve.md").open("a", encoding="utf-8") as page:
            page.write("\nSee [the missing page](no_such_page.md).\n")
    else:
        (root / "docs" / "recall.md").unlink()
    completed = _build(root, tmp_path / "site")
    assert completed.returncode != 0
    assert ("no_such_page.md" if plant == "link" else "recall.md") in completed.stderr
