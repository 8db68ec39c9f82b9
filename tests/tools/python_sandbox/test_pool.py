"""Pool lifecycle against the real daemon: containers go away on close, at exit, and
(when their owner crashed) at the next start; infrastructure faults say how to fix them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from agentenv.errors import ToolError
from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool, SandboxPool, build_image
from agentenv.tools.python_sandbox.pool import RUNNER_CAPS, _owner_id

pytestmark = pytest.mark.docker

LABEL = PythonSandboxConfig.label


def labelled(client) -> set[str]:
    return {c["Id"] for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"})}


def run_child(body: str) -> list[str]:
    """Runs `body` in a fresh interpreter; returns the container ids it printed."""
    code = "import asyncio, os, signal\nfrom agentenv.tools.python_sandbox import SandboxPool, PythonSandboxConfig\n"
    out = subprocess.run(
        [sys.executable, "-c", code + textwrap.dedent(body)], capture_output=True, text=True, timeout=120
    )
    ids = [line for line in out.stdout.split() if len(line) == 64]
    assert ids, out.stdout + out.stderr
    return ids


async def test_the_container_is_locked_down(docker_client, stateless_pool):
    (cid,) = stateless_pool.containers
    attrs = docker_client.api.inspect_container(cid)
    host, conf = attrs["HostConfig"], attrs["Config"]
    assert host["NetworkMode"] == "none" and conf["NetworkDisabled"]
    assert host["Memory"] == 512 * 2**20 and host["MemorySwap"] == 512 * 2**20
    cfg = stateless_pool.config
    assert host["PidsLimit"] == cfg.pids_limit * (cfg.sessions_per_container + 2) + 16 and host["NanoCpus"] == 10**9
    assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert sorted(host["CapAdd"]) == sorted(RUNNER_CAPS)  # the runner's; every call drops them with its uid
    assert "mode=0711" in host["Tmpfs"]["/work"] and conf["User"] == "0:0"
    assert host["Sysctls"] == {  # no SysV IPC, no POSIX queues: their names are shared by every episode
        "kernel.shmmni": "0", "kernel.msgmni": "0", "kernel.sem": "0 0 0 0", "fs.mqueue.queues_max": "0"
    }  # fmt: skip
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}}
    assert conf["Labels"][LABEL] == "1" and conf["Labels"][f"{LABEL}.owner"] == _owner_id()


async def test_close_removes_the_containers(docker_client, sandbox_image):
    pool = SandboxPool(PythonSandboxConfig(pool_size=2))
    await pool.start()
    ids = set(pool.containers)
    assert len(ids) == 2 and ids <= labelled(docker_client)
    assert (await pool.run("print(2 + 2)")).stdout == "4\n"
    await pool.aclose()
    assert not ids & labelled(docker_client)


def test_exit_without_close_removes_the_containers(docker_client, sandbox_image):
    ids = run_child("""
        pool = SandboxPool(PythonSandboxConfig(pool_size=1))
        asyncio.run(pool.start())
        print(*pool.containers)
    """)  # the interpreter exits with the pool open: atexit cleans up
    assert not set(ids) & labelled(docker_client)


async def test_start_removes_what_a_crashed_run_left(docker_client, sandbox_image):
    ids = run_child("""
        pool = SandboxPool(PythonSandboxConfig(pool_size=1))
        asyncio.run(pool.start())
        print(*pool.containers, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no close
    """)
    assert set(ids) <= labelled(docker_client)
    # A container whose owner is alive (this process) must survive the cleanup.
    alive = docker_client.api.create_container(
        sandbox_image, command=["true"], labels={LABEL: "1", f"{LABEL}.owner": _owner_id()}
    )["Id"]
    pool = SandboxPool(PythonSandboxConfig(pool_size=1))
    try:
        await pool.start()
        left = labelled(docker_client)
        assert not set(ids) & left
        assert alive in left
    finally:
        await pool.aclose()
        docker_client.api.remove_container(alive, force=True)


async def test_a_container_killed_from_outside_is_replaced(docker_client, sandbox_image):
    pool = SandboxPool(PythonSandboxConfig(pool_size=1))
    try:
        await pool.start()
        (old,) = pool.containers
        docker_client.api.kill(old)
        r = await pool.run("print('back')")
        if r.stdout != "back\n":  # the kill raced the call: it reports, then the next call is served
            assert "died" in r.error
            r = await pool.run("print('back')")
        assert r.stdout == "back\n" and pool.containers and old not in pool.containers
    finally:
        await pool.aclose()
    assert old not in labelled(docker_client)


async def test_missing_image_says_how_to_build_it(docker_client):
    tool = PythonTool(PythonSandboxConfig(image="agentenv/no-such-image:0", pool_size=1))
    try:
        with pytest.raises(ToolError, match="agentenv sandbox build"):
            await tool("print(1)")
    finally:
        await tool.aclose()


async def test_no_daemon_says_how_to_start_one(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    tool = PythonTool(PythonSandboxConfig(pool_size=1, docker_timeout_s=2))
    try:
        with pytest.raises(ToolError, match="setup_docker.sh"):
            await tool("print(1)")
    finally:
        await tool.aclose()


def test_build_image_is_idempotent(sandbox_image):
    said = []
    assert build_image(PythonSandboxConfig(), log=said.append) == sandbox_image
    assert said == [f"sandbox image {sandbox_image} already present"]


async def test_the_pool_serves_any_event_loop(stateless_pool):
    # The fixture started the pool under another asyncio.run; this test's loop uses it too.
    r = await stateless_pool.run("print(sum(range(10)))")
    assert r.ok and r.stdout == "45\n"
    r2 = await asyncio.gather(*(stateless_pool.run(f"print({i})") for i in range(3)))
    assert [x.stdout for x in r2] == ["0\n", "1\n", "2\n"]


async def test_the_docker_log_of_a_container_stays_small(docker_client, stateless_pool):
    # Replies go to the container's stdout, which Docker also logs: 4 MB of them must not stay on the host.
    (cid,) = stateless_pool.containers
    for _ in range(500):
        r = await stateless_pool.run("print('x' * 8000)")
        assert r.ok
    path = docker_client.api.inspect_container(cid)["LogPath"]
    assert os.path.getsize(path) <= (1 << 20) + 65536
