"""The shape of the code: imports run one way (the layers declared in pyproject.toml, no cycles), and the
CLI stays light (`assay --help` imports no torch; `assay stack` imports no system)."""

from __future__ import annotations

import ast
import json
import os
import re
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


SERVE_SETTINGS = {
    "assay.serve.settings", "assay.serve.engine", "assay.serve.engine.config", "assay.serve.engine.scheduler",
    "assay.serve.http", "assay.serve.http.middleware", "assay.serve.http.responses", "assay.serve.runner",
    "assay.serve.runner.dtypes", "assay.serve.runner.gemm",
}


@pytest.mark.slow
def test_assay_stack_imports_no_system_and_no_transformers():
    modules = _imports_of("stack", "--json", "--backend", "aot_eager")
    assert "transformers" not in modules
    # Registering the commands imports each system's package and its commands module, nothing else of it.
    system_modules = {m for m in modules if m.startswith("assay.") and not m.startswith("assay.core")}
    # assay.models.auto: the import hook `import assay` installs (GLA for Transformers' Auto classes); it
    # imports neither torch nor Transformers until Transformers loads.
    allowed = {m for m in system_modules if m.count(".") == 1 or m.endswith(("commands", "bench_commands"))} | {"assay.models.auto"}
    # `assay serve` derives its options from the settings' declarations (each declared once, with its flag):
    # the torch-free modules that declare them, and the packages above them (whose faces load nothing).
    allowed |= SERVE_SETTINGS & system_modules
    assert system_modules == allowed, sorted(system_modules - allowed)


def test_serving_is_three_layer_packages_under_a_small_top():
    # http -> engine -> runner (the import contract above holds the direction); what stays at the top is the
    # commands, the settings, the start-up and Ray: at most 10 modules.
    serve = REPO / "assay" / "serve"
    assert {"http", "engine", "runner"} <= {path.name for path in serve.iterdir() if (path / "__init__.py").is_file()}
    top = sorted(path.name for path in serve.glob("*.py"))
    assert len(top) <= 10, top


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


def _only_re_exports(tree: ast.Module) -> bool:
    """True for a module whose body, past its docstring, is imports plus at most `__all__` and plain name aliases
    (`X = Y`, `a, b = A.f, B.g`): it defines nothing, so its callers should import from the defining module."""
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant) else tree.body
    imports = 0
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports += not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if [getattr(target, "id", None) for target in targets] == ["__all__"]:
            continue
        value = node.value if targets else None
        items = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
        if value is None or not all(isinstance(item, (ast.Name, ast.Attribute)) for item in items):
            return False
    return imports > 0


def _modules(*folders: str):
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name != "__init__.py":
                yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")


def test_no_module_only_re_exports_names():
    # A package's __init__.py may be its face; any other module that only imports and re-exports is a forwarder
    # left by a split: callers import from the module that defines the name.
    assert _only_re_exports(ast.parse('"""doc."""\nfrom a import b\nc = b\n__all__ = ["b", "c"]\n'))  # the check bites
    assert not _only_re_exports(ast.parse('"""doc."""\nfrom a import b\n\ndef f():\n    return b\n'))
    assert not _only_re_exports(ast.parse('"""doc."""\nfrom a import b\nLIMIT = 3\n'))  # a constant is a definition
    forwarders = [path for path, text in _modules("assay", "bench") if _only_re_exports(ast.parse(text))]
    assert forwarders == []


MAX_F401_OUTSIDE_INIT = 3
SUPPRESSION = re.compile(r"#\s*noqa:\s*F401")  # the comment itself, not a mention of it in a string


def test_at_most_three_unused_import_suppressions_outside_package_faces():
    # `noqa: F401` outside an __init__.py is a re-export (or an import kept for its side effect); the few
    # side-effect imports that must stay, the tests' included, fit in three.
    found = [f"{path}:{number}" for path, text in _modules("assay", "bench", "tests")
             for number, line in enumerate(text.splitlines(), start=1) if SUPPRESSION.search(line)]
    assert len(found) <= MAX_F401_OUTSIDE_INIT, found


MAX_RESULT_FILES = 48  # each benchmark's current JSON and PNG: grows with new benchmarks, never with old runs


def test_bench_results_keep_one_current_result_per_benchmark():
    # bench/results/ holds each benchmark's current JSON (and PNG); earlier runs live in git history, not
    # beside it. Every file there is named in docs/benchmarks.md, the index a reader starts from.
    files = sorted(path.name for path in (REPO / "bench" / "results").rglob("*") if path.is_file())
    assert 10 < len(files) <= MAX_RESULT_FILES, files
    index = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert [name for name in files if name not in index] == []
