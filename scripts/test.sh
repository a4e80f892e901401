#!/usr/bin/env bash
# The whole test suite, set-up included: `bash scripts/test.sh` on a fresh machine (pytest's flags pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
# A real browser for the web-app tests: Debian's Chromium (Playwright drives it; it downloads no browser).
# apt-get installs it in the background while pip sets up .venv (each keeps one core busy, most of it waiting on
# disk and unpacking); pytest starts once both are done.
browser_pid=""
browser_log=$(mktemp)
trap 'rm -f "$browser_log"' EXIT
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test: installing Chromium with apt-get for the browser tests (in the background)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >"$browser_log" 2>&1 &
    browser_pid=$!
  else
    echo "test: chromium not found and cannot be installed here (need root and apt-get); the browser tests will fail" >&2
  fi
fi
echo "test: setting up .venv with every extra the tests use" >&2
bash scripts/setup.sh test
# shellcheck disable=SC1091
. .venv/bin/activate
if [ -n "$browser_pid" ]; then
  if wait "$browser_pid"; then
    echo "test: Chromium installed" >&2
  else
    echo "test: installing Chromium failed; the browser tests will fail. apt-get said:" >&2
    tail -5 "$browser_log" >&2
  fi
fi
# One pytest process keeps about one core busy (it waits on servers, subprocesses and HTTP round trips):
# 3 pytest-xdist workers keep both cores of a 2-core machine busy. ASSAY_TEST_WORKERS=0 runs it in this process.
workers="${ASSAY_TEST_WORKERS:-3}"
echo "test: running pytest with $workers workers $*" >&2
python -m pytest -n "$workers" --dist loadfile "$@"
