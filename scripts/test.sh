#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite.
# pytest's exit 5 (no tests collected) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
python3 -m pytest -q -p no:randomly "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
