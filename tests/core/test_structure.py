"""The shape of the code: imports run one way (the layers declared in pyproject.toml, no cycles), and the
CLI stays light (`assay --help` imports no torch; `assay stack` imports no system)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs `assay ARGS...` in this interpreter, then reports what it imported.
_REPORT_IMPORTS = """
import json, sys
sys.argv = ["assay", *sys.argv[1:]]
from assay.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _imports_of(*args: str) -> set[str]:
    completed = subprocess.run([sys.executable, "-c", _REPORT_IMPORTS, *args], capture_output=True, text=True, timeout=300,
                               env=os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert completed.stdout.strip(), completed.stderr
    return set(json.loads(completed.stderr.strip().splitlines()[-1]))


def test_imports_follow_the_declared_layers_and_have_no_cycles():
    # lint-imports reads [tool.importlinter] from pyproject.toml; --no-cache writes nothing into the repo.
    completed = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())", "--no-cache"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 broken" in completed.stdout, completed.stdout


def test_assay_help_imports_no_torch():
    # What makes `assay --help` answer in well under a second (0.4 s on an idle 2-core machine, interpreter
    # start-up included; bench/core/cli_startup.py measures it): no torch, numpy or Transformers behind it.
    modules = _imports_of("--help")
    assert "assay.cli" in modules and "assay.serve.commands" in modules
    assert not {"torch", "numpy", "transformers", "pyarrow", "fastapi"} & modules, "assay --help imported a heavy library"


@pytest.mark.slow
def test_assay_stack_imports_no_system_and_no_transformers():
    modules = _imports_of("stack", "--json", "--backend", "aot_eager")
    assert "transformers" not in modules
    # Registering the commands imports each system's package and its commands module, nothing else of it.
    system_modules = {m for m in modules if m.startswith("assay.") and not m.startswith("assay.core")}
    # assay.models.auto: the import hook `import assay` installs (GLA for Transformers' Auto classes); it
    # imports neither torch nor Transformers until Transformers loads.
    allowed = {m for m in system_modules if m.count(".") == 1 or m.endswith(("commands", "bench_commands"))} | {"assay.models.auto"}
    assert system_modules == allowed, sorted(system_modules - allowed)


MAX_MODULE_LINES = 400


def test_no_module_over_400_lines_in_assay_or_bench():
    # A module over 400 lines holds several concerns: split it by concern (issue #31), not in halves.
    sizes = {str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
             for folder in ("assay", "bench") for path in (REPO / folder).rglob("*.py")}
    assert len(sizes) > 100  # the scan found the code
    assert {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}


@pytest.mark.parametrize("command", ["serve", "serve-bench"])
def test_serving_help_names_the_registered_architectures(command):
    # The torch-free list the help reads is the registry's: every registered entry, no other.
    from assay.models import builtin_arch_names
    from assay.models.registry import names

    assert sorted(builtin_arch_names()) == names()
    completed = subprocess.run([sys.executable, "-m", "assay", command, "--help"], capture_output=True, text=True, timeout=300,
                               env=os.environ | {"COLUMNS": "400", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert completed.returncode == 0, completed.stderr
    assert f"checkpoint folder of a registered architecture ({', '.join(builtin_arch_names())}" in completed.stdout
