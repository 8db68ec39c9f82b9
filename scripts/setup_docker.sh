#!/usr/bin/env bash
# Makes a Docker daemon answer for the Python sandbox, idempotently, and says what it did:
#   1. installs docker.io (and debootstrap, for the offline image build) with apt-get when missing;
#   2. where no daemon answers, starts `dockerd --bridge=none --iptables=false` in the
#      background (no bridge network, no iptables rules, nothing on private address
#      ranges: sandbox containers run with networking off), logging to $DOCKERD_LOG;
#   3. waits until `docker info` works;
#   4. with --image, builds the sandbox image if it is missing (`agentenv sandbox build`).
# Usage: bash scripts/setup_docker.sh [--image]
# Env: DOCKERD_LOG (default /var/log/dockerd-agentenv.log), DOCKER_WAIT_S (default 60), PYTHON.
set -euo pipefail

log() { printf '[setup_docker] %s\n' "$*"; }
LOG_FILE=${DOCKERD_LOG:-/var/log/dockerd-agentenv.log}
WAIT_S=${DOCKER_WAIT_S:-60}
PY=${PYTHON:-python3}
BUILD_IMAGE=0
for arg in "$@"; do
  case "$arg" in
    --image) BUILD_IMAGE=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) log "unknown argument: $arg"; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    log "not root and no sudo: run this script as root"; exit 1
  fi
fi

# 1. The engine, and debootstrap (the offline image build needs it where no registry answers).
missing=""
if command -v docker >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1; then
  log "docker and dockerd already installed ($(docker --version 2>/dev/null || echo '?'))"
else
  missing="docker.io"
fi
if command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ]; then
  log "debootstrap already installed"
else
  missing="$missing debootstrap"
fi
if [ -n "$missing" ]; then
  log "installing ${missing# } with apt-get"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  # shellcheck disable=SC2086
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi

# 2. The daemon.
if $SUDO docker info >/dev/null 2>&1; then
  log "a Docker daemon already answers; leaving it as it is"
else
  if command -v pgrep >/dev/null 2>&1 && pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is running but does not answer yet; waiting for it"
  else
    log "starting dockerd --bridge=none --iptables=false (log: $LOG_FILE)"
    $SUDO mkdir -p "$(dirname "$LOG_FILE")"
    $SUDO sh -c "nohup dockerd --bridge=none --iptables=false >>'$LOG_FILE' 2>&1 &"
  fi
  # 3. Wait for it.
  for ((i = 0; i < WAIT_S * 2; i++)); do
    if $SUDO docker info >/dev/null 2>&1; then break; fi
    sleep 0.5
  done
  if ! $SUDO docker info >/dev/null 2>&1; then
    log "dockerd did not answer within ${WAIT_S}s; last lines of $LOG_FILE:"
    $SUDO tail -n 20 "$LOG_FILE" || true
    exit 1
  fi
  log "dockerd answers"
fi
log "daemon: $($SUDO docker info --format '{{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}' 2>/dev/null || echo '?')"

# 4. The sandbox image (idempotent: used as is when present).
if [ "$BUILD_IMAGE" -eq 1 ]; then
  cd "$(dirname "$0")/.."
  log "sandbox image: $PY -m agentenv.tools.python_sandbox build"
  $SUDO "$PY" -m agentenv.tools.python_sandbox build
fi
log "done"
