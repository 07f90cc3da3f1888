#!/usr/bin/env bash
# Installs (scripts/install.sh) and runs the whole test suite, end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
set +e
.venv/bin/python -m pytest -q --durations=30 "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests (e.g. a -k filter that matches nothing): not a failure.
if [ "$rc" -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi
exit "$rc"
