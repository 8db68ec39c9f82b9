"""Session mode against the real daemon: variables persist like notebook cells, and
`fork()` copies the live state so that branches never see each other's changes."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentenv.tools.base import Tool
from agentenv.tools.python_sandbox import PythonTool

pytestmark = pytest.mark.docker


async def test_variables_persist_between_calls(proto):
    ep = proto.fork()
    try:
        assert (await ep("x = 40\ndef f(v):\n    return v + 2")).ok
        r = await ep("f(x)")
        assert r.ok and r.text == "42"
    finally:
        await ep.aclose()


async def test_fork_makes_an_independent_copy(proto):
    ep = proto.fork()
    try:
        await ep("x = 1\nitems = [1]\nopen('notes.txt', 'w').write('parent')")
        branch = ep.fork()
        assert isinstance(branch, Tool) and branch is not ep
        r = await branch("x = 2\nitems.append(2)\nopen('notes.txt', 'w').write('branch')\nx, items")
        assert r.text == "(2, [1, 2])"
        r = await ep("x, items, open('notes.txt').read()")
        assert r.text == "(1, [1], 'parent')"  # the branch's assignment left the parent's x untouched
        await ep("x = 3")
        r = await branch("x, items, open('notes.txt').read()")
        assert r.text == "(2, [1, 2], 'branch')"  # and the other way round
        await branch.aclose()
    finally:
        await ep.aclose()


async def test_fork_is_lazy_but_snapshots_before_later_calls(proto):
    ep = proto.fork()
    try:
        await ep("x = 'at fork'")
        t0 = time.monotonic()
        branches = [ep.fork() for _ in range(3)]
        assert time.monotonic() - t0 < 0.05  # fork() does not wait for the container
        parent_call = asyncio.create_task(ep("x = 'parent moved on'"))  # submitted right after the forks
        texts = [(await b("x")).text for b in branches]
        await parent_call
        assert texts == ["'at fork'"] * 3
        assert (await ep("x")).text == "'parent moved on'"
        nested = branches[0].fork()
        await branches[0]("x = 'b0'")
        assert (await nested("x")).text == "'at fork'"
        for b in [*branches, nested]:
            await b.aclose()
    finally:
        await ep.aclose()


async def test_prototype_forks_into_fresh_empty_sessions(proto):
    a, b = proto.fork(), proto.fork()
    try:
        await a("secret = 7")
        r = await b("'secret' in globals()")
        assert r.text == "False"
        assert (await a("secret")).text == "7"
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_timed_out_cell_rolls_back(proto):
    ep = proto.fork()
    try:
        await ep("x = 1")
        t0 = time.monotonic()
        r = await ep("x = 2\nwhile True:\n    pass")
        assert time.monotonic() - t0 < ep.config.timeout_s + 2
        assert not r.ok and r.metadata["timed_out"] and r.metadata["rolled_back"]
        assert "as they were before this call" in r.text
        assert (await ep("x")).text == "1"
    finally:
        await ep.aclose()


async def test_an_exception_keeps_what_ran_before_it(proto):
    ep = proto.fork()
    try:
        r = await ep("y = 5\nraise ValueError('bad')")
        assert not r.ok and r.error == "ValueError: bad"
        assert (await ep("y")).text == "5"  # as in a notebook
    finally:
        await ep.aclose()


async def test_out_of_memory_rolls_back_and_session_goes_on(proto):
    ep = proto.fork()
    try:
        await ep("keep = 'still here'")
        r = await ep("data = b'x' * (4 * 1024 ** 3)")
        assert not r.ok and "MemoryError" in r.text
        assert (await ep("keep")).text == "'still here'"
    finally:
        await ep.aclose()


async def test_background_processes_die_with_their_cell(proto):
    ep = proto.fork()
    try:
        await ep("import subprocess\np = subprocess.Popen(['sleep', '300'])")
        await asyncio.sleep(0.2)
        r = await ep(
            "def alive(pid):\n"
            "    try:\n"
            "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
            "    except OSError:\n"
            "        return False\n"
            "alive(p.pid)"
        )
        assert r.text == "False"  # killed when its cell ended
    finally:
        await ep.aclose()


async def test_a_lost_session_is_reported_then_replaced(proto):
    ep = proto.fork()
    try:
        await ep("v = 1")
        # The cell kills its head (its parent) and then itself: nothing holds the variables.
        r = await ep("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)")
        assert not r.ok and r.error == "session lost", r
        assert "define your variables again" in r.text
        r = await ep("'v' in globals()")
        assert r.ok and r.text == "False"  # a fresh session serves the next call
    finally:
        await ep.aclose()


async def test_aclose_kills_the_session(proto, session_pool):
    ep = proto.fork()
    await ep("import os\npid = os.getpid()")
    pid = int((await ep("pid")).text)
    await ep.aclose()
    probe = proto.fork()
    try:
        r = await probe(f"import os\nos.path.exists('/proc/{pid}')")
        assert r.text == "False"
    finally:
        await probe.aclose()


async def test_many_sessions_fork_concurrently(proto):
    eps = [proto.fork() for _ in range(4)]
    try:
        await asyncio.gather(*(ep(f"n = {i}") for i, ep in enumerate(eps)))
        forks = [ep.fork() for ep in eps]
        await asyncio.gather(*(f("n += 100") for f in forks))
        got = await asyncio.gather(*(t("n") for t in eps + forks))
        assert [r.text for r in got] == ["0", "1", "2", "3", "100", "101", "102", "103"]
        for f in forks:
            await f.aclose()
    finally:
        for ep in eps:
            await ep.aclose()


async def test_prototype_called_directly_keeps_its_own_session(session_pool):
    tool = PythonTool(pool=session_pool)
    try:
        await tool("z = 9")
        assert (await tool("z")).text == "9"
        twin = tool.fork()
        assert (await twin("z")).text == "9"
        await twin.aclose()
    finally:
        await tool.aclose()


async def test_code_bigger_than_a_pipe_reaches_the_session(session_pool):
    session = await session_pool.open_session()
    try:
        r = await session.run("x = '" + "a" * 1_500_000 + "'\nprint(len(x))")  # > the 1 MiB pipe
        assert r.ok and r.stdout == "1500000\n"
        r = await session.run("print(len(x) + 1)")
        assert r.stdout == "1500001\n"
    finally:
        await session.aclose()
