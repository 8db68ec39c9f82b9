"""Lazy access to the Docker SDK, with errors that say how to fix them.

`import agentenv` never imports `docker`; only these functions do.
"""

from __future__ import annotations

from typing import Any

from agentenv.errors import ToolError

SETUP_HINT = "run scripts/setup_docker.sh (it installs docker.io and starts `dockerd --bridge=none --iptables=false`)"
BUILD_HINT = "run `agentenv sandbox build` (or `python -m agentenv.tools.python_sandbox build`)"


def docker_client(timeout_s: float = 60.0) -> Any:
    """A connected `docker.DockerClient` (from the environment: DOCKER_HOST, ...).

    Raises:
        ToolError: the SDK is missing or no daemon answers.
    """
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker is a dependency
        raise ToolError(f"the docker SDK is not installed ({e}): pip install 'docker>=7'") from e
    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
        client.ping()
    except Exception as e:  # DockerException, requests ConnectionError, FileNotFoundError...
        raise ToolError(f"no Docker daemon answers ({type(e).__name__}: {e}); {SETUP_HINT}") from e
    return client


def image_exists(client: Any, image: str) -> bool:
    import docker

    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


def require_image(client: Any, image: str) -> None:
    """Raises ToolError naming the fix when `image` is not in the daemon."""
    if not image_exists(client, image):
        raise ToolError(f"sandbox image {image!r} not found; {BUILD_HINT}")
