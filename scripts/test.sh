#!/usr/bin/env bash
# The whole test suite, set-up included: `bash scripts/test.sh` on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pytest "$@"
