#!/usr/bin/env bash
# Installs (scripts/install.sh) and runs the whole test suite, end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
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
