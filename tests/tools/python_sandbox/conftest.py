"""Fixtures for sandbox tests: the image (built once if missing), shared warm pools,
and a check that no container of this test process is left behind."""

from __future__ import annotations

import asyncio
import os

import pytest

from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool, SandboxPool, build_image

LABEL = PythonSandboxConfig.label
HOSTILE_TIMEOUT_S = 2.0


def _daemon_or_skip():
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:  # no SDK, no socket, daemon down
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}: {e}); run scripts/setup_docker.sh")
    return client


@pytest.fixture(scope="session")
def docker_client():
    return _daemon_or_skip()


@pytest.fixture(scope="session")
def sandbox_image(docker_client):
    """The default sandbox image; built (slowly, once per machine) if missing."""
    return build_image(PythonSandboxConfig(pull_timeout_s=10), log=lambda msg: print(f"[sandbox image] {msg}"))


@pytest.fixture(scope="session", autouse=True)
def no_leftover_containers():
    """After the whole test session, no labelled container of this process may remain."""
    yield
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception:
        return  # no daemon: nothing could have been started
    from agentenv.tools.python_sandbox.pool import _owner_id

    me = _owner_id()
    left = [
        c["Id"][:12]
        for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
        if (c.get("Labels") or {}).get(f"{LABEL}.owner") == me
    ]
    assert not left, f"sandbox containers left behind by this test session: {left}"


def _start_pool(cfg: PythonSandboxConfig) -> SandboxPool:
    pool = SandboxPool(cfg)
    asyncio.run(pool.start())  # the pool's I/O runs in its own thread, so any loop may use it later
    return pool


@pytest.fixture(scope="session")
def stateless_pool(sandbox_image):
    """One warm container, so every hostile call hits the same one and its recovery is tested."""
    pool = _start_pool(PythonSandboxConfig(pool_size=1, timeout_s=HOSTILE_TIMEOUT_S))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def session_pool(sandbox_image):
    pool = _start_pool(PythonSandboxConfig(pool_size=1, mode="session", timeout_s=HOSTILE_TIMEOUT_S))
    yield pool
    pool.close()


@pytest.fixture
def py(stateless_pool):
    return PythonTool(pool=stateless_pool)


@pytest.fixture
def proto(session_pool):
    """A session-mode prototype tool: forks of it are fresh sessions."""
    return PythonTool(pool=session_pool)


@pytest.fixture
def owner_pid():
    return os.getpid()
