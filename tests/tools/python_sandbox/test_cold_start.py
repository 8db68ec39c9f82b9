"""A pool whose start is slower than a call's timeout: the cold machine of a newcomer's first run.

On a fresh machine (page cache cold, the engine loading beside it, two cores)
starting four containers that import numpy and sympy and run the warm-up took
longer than `env.tool_timeout_s` (30 s). The start ran inside the first call,
so that call's timeout cancelled it halfway, left its containers running, and
the next call started over: all 106 python calls of the first evaluation timed
out (arithmetic 0%), and 38 containers were made. A warm-up that sleeps makes
the same condition on any machine.
"""

from __future__ import annotations

import asyncio

import pytest

from agentenv.errors import ToolError
from agentenv.tools.python_sandbox import PythonSandboxConfig, SandboxPool
from agentenv.tools.python_sandbox.pool import _owner_id

pytestmark = pytest.mark.docker

SLOW_START_S = 4.0
CALL_TIMEOUT_S = 1.0


def slow_start(**kw) -> PythonSandboxConfig:
    return PythonSandboxConfig(pool_size=2, preload=(), warmup=f"import time; time.sleep({SLOW_START_S})", **kw)


def my_containers(docker_client) -> list[str]:
    label = PythonSandboxConfig.label
    return [
        c["Id"]
        for c in docker_client.api.containers(all=True, filters={"label": f"{label}=1"})
        if (c.get("Labels") or {}).get(f"{label}.owner") == _owner_id()
    ]


async def test_a_start_slower_than_the_callers_timeout_finishes_once_for_every_caller(sandbox_image, docker_client):
    before = set(my_containers(docker_client))
    pool = SandboxPool(slow_start())
    answers: list[str | None] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60  # a loaded machine starts slowly; the old code never answered at all
    try:
        while loop.time() < deadline and answers[-1:] != ["42\n"]:
            try:  # each caller gives up after a second, as env.tool_timeout_s makes it
                answers.append((await asyncio.wait_for(pool.run("print(6 * 7)"), CALL_TIMEOUT_S)).stdout)
            except TimeoutError:
                answers.append(None)
        made = set(my_containers(docker_client)) - before
    finally:
        await pool.aclose()
    assert answers[0] is None  # the first callers gave up while the pool started ...
    assert "42\n" in answers and answers[-1] == "42\n", answers  # ... and the one start finished for the later ones
    assert len(made) == 2, made  # one start: pool_size containers, none left over from a cancelled attempt
    assert set(my_containers(docker_client)) == before  # closed: nothing left behind


async def test_the_health_check_waits_out_a_slow_start_so_no_call_times_out(sandbox_image, docker_client):
    pool = SandboxPool(slow_start())
    try:
        await pool.health_check()  # what a run does before its first evaluation
        answers = await asyncio.gather(*(asyncio.wait_for(pool.run("print(1)"), 5 * CALL_TIMEOUT_S) for _ in range(4)))
    finally:
        await pool.aclose()
    assert [a.stdout for a in answers] == ["1\n"] * 4


async def test_a_pool_closed_while_it_starts_leaves_no_container(sandbox_image, docker_client):
    before = set(my_containers(docker_client))
    pool = SandboxPool(slow_start())
    call = asyncio.ensure_future(pool.run("print(1)"))
    await asyncio.sleep(SLOW_START_S / 2)  # the containers exist and warm up
    await pool.aclose()
    with pytest.raises(ToolError, match="closed"):
        await call
    assert set(my_containers(docker_client)) == before
