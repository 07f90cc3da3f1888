#!/usr/bin/env bash
# Installs (scripts/install.sh test: the main job, the test tools and every extra) and runs the whole test
# suite, end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh test
# The run viewer's browser tests (tests/test_viewer.py) drive Debian's chromium through chromium-driver: installed
# here, for the tests only, so the main job's install stays small.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { apt-get install -y -qq chromium chromium-driver \
      || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver; }; } >/dev/null 2>&1; then :
  else echo "test.sh: chromium / chromium-driver not installed; tests/test_viewer.py's browser test needs them"; fi
fi
set +e
# Two workers (pytest-xdist): the end-to-end tests wait on engine start-up, process spawns and imports for
# much of their time, which the other worker fills; tests/conftest.py groups them (a module stays on one worker,
# every Ray test together) and gives each worker's vLLM engines a core of their own.
.venv/bin/python -m pytest -q -n 2 --durations=30 "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests (e.g. a -k filter that matches nothing): not a failure.
if [ "$rc" -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi
exit "$rc"
