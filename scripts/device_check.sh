#!/usr/bin/env bash
# One prepared device check: `assay selftest` with the same flags (docs/device_check.md).
#
#   bash scripts/device_check.sh --device cuda --out /tmp/check [--quick] [--python PY] [other selftest flags]
#
# Which Python runs it: --python PY, else $ASSAY_PYTHON, else this repo's .venv (scripts/setup.sh makes it
# when absent). On a GPU machine name the Python that already holds a CUDA build of torch
# (ASSAY_PYTHON=python3): setup.sh would install the CPU build, and machines without a network cannot
# install anything. Whichever Python runs it, assay is imported from this checkout (PYTHONPATH), so
# nothing needs installing. Exit code: selftest's (0 every part passed, 1 some did not, 2 bad input).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

PY=${ASSAY_PYTHON:-}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || { echo "device_check: --python needs a value" >&2; exit 2; }; PY=$2; shift 2 ;;
    --python=*) PY=${1#--python=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

if [ -z "$PY" ]; then
  [ -x "$REPO/.venv/bin/python" ] || bash "$REPO/scripts/setup.sh" >&2
  PY="$REPO/.venv/bin/python"
fi
command -v "$PY" >/dev/null 2>&1 || { echo "device_check: no Python at $PY" >&2; exit 2; }

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# What every part imports; a device image may lack some (carry them as wheels: docs/device_check.md).
missing=$("$PY" -c '
import importlib.util
need = ["torch", "transformers", "safetensors", "tokenizers", "pyarrow", "typer", "rich", "psutil", "numpy", "matplotlib"]
print(" ".join(name for name in need if importlib.util.find_spec(name) is None))')
if [ -n "$missing" ]; then
  echo "device_check: $PY lacks $missing; install them or carry their wheels (docs/device_check.md)" >&2
  exit 2
fi
"$PY" -c 'import sys, torch, transformers; print(f"device_check: {sys.executable}: torch {torch.__version__}, transformers {transformers.__version__}")' >&2
exec "$PY" -m assay selftest ${args[@]+"${args[@]}"}
