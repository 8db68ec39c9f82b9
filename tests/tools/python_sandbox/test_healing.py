"""Session pools under load and under failure, against the real daemon: concurrent episodes
spread over the containers, a full pool waits for a slot, a container killed or frozen under
live sessions is replaced (the pool never shrinks) and its sessions report that they are lost."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool, SandboxPool, SessionLost

pytestmark = pytest.mark.docker


async def started(cfg: PythonSandboxConfig) -> SandboxPool:
    pool = SandboxPool(cfg)
    await pool.start()
    return pool


async def until(predicate, within_s: float) -> float:
    """Seconds until `predicate()` held (polling); fails after `within_s`."""
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < within_s, f"not within {within_s} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_64_concurrent_episodes_on_a_pool_of_4_all_succeed(sandbox_image):
    pool = await started(PythonSandboxConfig(pool_size=4, mode="session", timeout_s=10))

    async def episode(i: int) -> list:
        tool = PythonTool(pool=pool)
        try:
            return [await tool(code) for code in (f"x = {i}\nimport numpy as np", "x += 1", "print(x, np.arange(3).sum())")]
        finally:
            await tool.aclose()

    try:
        results = await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(64))), 60)
    finally:
        await pool.aclose()
    assert [r.text for rs in results for r in rs if not r.ok] == []
    assert [rs[2].text for rs in results] == [f"{i + 1} 3" for i in range(64)]
    # Each open counted against its container when it was placed: 16 episodes on each of the 4.
    assert sorted(collections.Counter(rs[0].metadata["container"] for rs in results).values()) == [16] * 4


async def test_a_full_pool_waits_for_a_free_slot(sandbox_image):
    pool = await started(PythonSandboxConfig(pool_size=1, mode="session", sessions_per_container=2, timeout_s=5))
    try:
        a, b = await pool.open_session(), await pool.open_session()
        fork = a.fork()  # a fork shares its session's slot
        third = asyncio.create_task(pool.open_session())
        call = asyncio.create_task(pool.run("print('stateless')"))  # takes a slot too
        await asyncio.sleep(0.5)
        assert not third.done() and not call.done()
        await b.aclose()
        c = await asyncio.wait_for(third, 5)
        assert (await c.run("print('third')")).stdout == "third\n"
        assert (await fork.run("print('fork')")).stdout == "fork\n"
        await c.aclose()
        assert (await asyncio.wait_for(call, 5)).stdout == "stateless\n"
        for s in (a, fork):
            await s.aclose()
    finally:
        await pool.aclose()


async def test_a_killed_container_under_live_sessions_is_replaced_and_its_sessions_report_lost(docker_client, sandbox_image):
    pool = await started(PythonSandboxConfig(pool_size=2, mode="session", timeout_s=5))
    tools = [PythonTool(pool=pool) for _ in range(4)]
    try:
        where = [(await t(f"v = {i}\n'placed'")).metadata["container"] for i, t in enumerate(tools)]
        assert sorted(collections.Counter(where).values()) == [2, 2]
        raw = await pool.open_session()
        doomed = next(cid for cid in pool.containers if cid.startswith(where[0]))
        raw_doomed = raw.channel.id == doomed
        docker_client.api.kill(doomed)
        await until(lambda: doomed not in pool.containers and len(pool.containers) == 2, 30)
        for i, t in enumerate(tools):
            r = await t("v")
            if where[i] == doomed[:12]:  # the model reads that its variables are gone ...
                assert not r.ok and r.error == "session lost" and "variables are gone" in r.text, r
                assert "define your variables again" in r.text
                r = await t("'v' in globals()")  # ... and the next call starts afresh, on a live container
                assert r.ok and r.text == "False" and r.metadata["container"] != doomed[:12]
            else:
                assert r.ok and r.text == str(i)
        if raw_doomed:
            with pytest.raises(SessionLost, match="variables are gone"):
                await raw.run("1")
        fresh = [await pool.open_session() for _ in range(4)]
        assert [(await s.run("print(1)")).stdout for s in fresh] == ["1\n"] * 4
        for s in (raw, *fresh):
            await s.aclose()
    finally:
        for t in tools:
            await t.aclose()
        await pool.aclose()


@pytest.mark.parametrize("mode", ["stateless", "session"])
async def test_a_frozen_container_answers_within_timeout_plus_2_s_and_is_replaced(docker_client, sandbox_image, mode):
    timeout = 1.0
    pool = await started(PythonSandboxConfig(pool_size=1, mode=mode, timeout_s=timeout))
    try:
        (frozen,) = pool.containers
        session = await pool.open_session() if mode == "session" else None
        run = session.run if session else pool.run
        t0 = time.monotonic()
        call = asyncio.create_task(run("import time\ntime.sleep(0.3)\nprint('done')"))
        await asyncio.sleep(0.1)
        docker_client.api.pause(frozen)
        try:
            r = await call
            assert "did not answer" in r.error and not r.ok, r
        except SessionLost as e:
            assert session is not None and "stopped answering" in str(e)
        assert time.monotonic() - t0 < timeout + 2.0
        await until(lambda: pool.containers and frozen not in pool.containers, 30)
        assert (await pool.run("print('back')")).stdout == "back\n"
    finally:
        await pool.aclose()
    assert frozen not in {c["Id"] for c in docker_client.api.containers(all=True)}
