"""Issue 29's sandbox breaks, each written as the attack (or the careless config) that found it:
a call that exhausts /work's inodes (S1), a tree deeper than Python's recursion limit (S2), a
file, directory or link planted where another episode writes (S3), a flood on a session's
control socket (S4), an infinite timeout (T3), and a sandbox that can never start (T4)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentenv.errors import ConfigError, ToolError
from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool, SessionLost, make_python_tool

pytestmark = pytest.mark.docker

FREE_INODES = "import os\nprint(os.statvfs('.').f_ffree)"


# ---------------------------------------------------------------------------
# S1, S2: cleanup that cannot be starved or recursed.


async def test_s1_a_call_that_exhausts_works_inodes_does_not_disable_its_container(stateless_pool):
    before = (await stateless_pool.run("print(0)")).container
    r = await stateless_pool.run(
        "import os\nn = 0\ntry:\n    while True:\n        open('f%d' % n, 'w').close()\n        n += 1\n"
        "except OSError as e:\n    print(n > 1000, e.errno)",
        timeout_s=20,
    )
    assert r.ok and r.stdout == "True 28\n", r  # ENOSPC: every inode of /work is taken
    for i in range(3):  # the next calls run on the same container, in a clean /work
        r = await stateless_pool.run(f"open('x', 'w').write('ok')\nprint({i})")
        assert r.ok and r.stdout == f"{i}\n" and r.container == before, r


async def test_s2_a_tree_3000_deep_is_removed_after_its_call(stateless_pool):
    free = int((await stateless_pool.run(FREE_INODES)).stdout)
    for _ in range(2):
        r = await stateless_pool.run(
            "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')", timeout_s=20
        )
        assert r.ok and r.stdout == "deep\n", r
    left = free - int((await stateless_pool.run(FREE_INODES)).stdout)
    assert left < 100, f"{left} inodes of /work were not freed after two 3000-deep trees"


# ---------------------------------------------------------------------------
# S3: no place that every episode of a container shares.

PLANT = """
import os
os.umask(0)
os.chmod('.', 0o711)
open('mine.txt', 'w').close()
made = []
for what, make in (
    ('file', lambda: open('/dev/shm/shared.txt', 'w').write('attacker')),
    ('dir', lambda: os.mkdir('/dev/shm/cache', 0o777)),
    ('link', lambda: os.symlink(os.path.abspath('mine.txt'), '/dev/shm/link.txt')),
):
    try:
        make()
        made.append(what)
    except OSError:
        pass
print(made)
"""
VICTIM = """
out = []
for path in ('/dev/shm/shared.txt', '/dev/shm/cache/out.txt', '/dev/shm/link.txt'):
    try:
        with open(path, 'w') as f:
            f.write(SECRET)
        out.append(open(path).read())
    except OSError as e:
        out.append(type(e).__name__)
print(out)
"""
READ_BACK = """
out = []
for path in ('/dev/shm/shared.txt', '/dev/shm/cache/out.txt', '/dev/shm/link.txt', 'mine.txt'):
    try:
        out.append(open(path).read())
    except OSError as e:
        out.append(type(e).__name__)
print(out)
"""


async def test_s3_a_file_dir_or_link_planted_in_dev_shm_does_not_reach_another_episode(session_pool):
    secret = "VICTIM-" + uuid.uuid4().hex
    attacker = await session_pool.open_session()
    victim = await session_pool.open_session()
    try:
        planted = await attacker.run(PLANT)
        assert planted.ok, planted
        v = await victim.run(f"SECRET = {secret!r}\n" + VICTIM)
        assert v.ok and "attacker" not in v.stdout, f"the victim read the attacker's file back: {v.stdout}"
        r = await attacker.run(READ_BACK)
        assert r.ok and secret not in r.stdout, f"the attacker read what the victim wrote: {r.stdout}"
    finally:
        await attacker.aclose()
        await victim.aclose()


# Every place outside its own directory where a call could make a name (a directory or a file it
# may write), and every IPC namespace it could make a key in.
SHARED_PLACES = """
import ctypes, os, stat
own, me, hits = os.getcwd(), os.getuid(), []
for root, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', own)]
    if os.access(root, os.W_OK):
        hits.append(root)
    for name in files:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_uid == me or st.st_mode & 0o022) and os.access(path, os.W_OK):
            hits.append(path)
libc = ctypes.CDLL(None, use_errno=True)
for name, made in (
    ('shmget', lambda: libc.shmget(0x2929, 4096, 0o1000 | 0o666)),
    ('msgget', lambda: libc.msgget(0x2929, 0o1000 | 0o666)),
    ('semget', lambda: libc.semget(0x2929, 1, 0o1000 | 0o666)),
    ('mq_open', lambda: libc.mq_open(b'/q29', os.O_CREAT | os.O_RDWR, 0o666, None)),
):
    if made() >= 0:
        hits.append(name)
print(sorted(hits))
"""


async def test_s3_a_call_can_make_a_name_nowhere_but_its_own_directory(stateless_pool, session_pool):
    session = await session_pool.open_session()
    try:
        for r in (await stateless_pool.run(SHARED_PLACES, timeout_s=20), await session.run(SHARED_PLACES, timeout_s=20)):
            assert r.ok and r.stdout == "[]\n", f"shared places a call can write: {r.stdout} {r.stderr}"
    finally:
        await session.aclose()


# ---------------------------------------------------------------------------
# S4: a flood on a session's own control socket.

FLOOD = """
import os, socket, stat, threading, time
socks = []
for fd in range(3, 64):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            socks.append(socket.socket(fileno=os.dup(fd)))
    except OSError:
        pass
def flood():
    end = time.time() + 6
    while time.time() < end:
        for s in socks:
            try:
                s.send(b'{}')
            except OSError:
                return
for _ in range(8):
    if os.fork() == 0:
        flood()
        os._exit(0)
threading.stack_size(1 << 16)  # 40 default stacks would pass the call's address-space cap
threads = [threading.Thread(target=flood) for _ in range(40)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print('flooded', len(socks))
"""


async def test_s4_a_control_socket_flood_ends_the_flooder_not_its_neighbours(session_pool):
    (container,) = session_pool.containers
    victims = [await session_pool.open_session() for _ in range(2)]
    attacker = await session_pool.open_session()
    try:
        for i, v in enumerate(victims):
            await v.run(f"x = {i}")
        t0 = time.monotonic()
        flood = asyncio.create_task(attacker.run(FLOOD, timeout_s=10))
        await asyncio.sleep(0.3)
        slowest = 0.0
        for _ in range(5):  # the neighbours answer at once while (and after) it floods
            for i, v in enumerate(victims):
                t = time.monotonic()
                r = await v.run("x")
                slowest = max(slowest, time.monotonic() - t)
                assert r.ok and r.stdout == f"{i}\n", r
        try:
            r = await flood
            lost = r.session_lost
        except SessionLost:
            lost = True
        assert lost, f"the flooding session was not ended: {r}"
        assert time.monotonic() - t0 < 5, "the flood ran on (the flooder was ended only by its timeout)"
        assert slowest < 1.5, f"a neighbour's call took {slowest:.1f} s during the flood"
        assert session_pool.containers == [container], "the container was replaced: every neighbour was lost"
    finally:
        for s in (*victims, attacker):
            await s.aclose()


# ---------------------------------------------------------------------------
# T3, T4: numbers that cannot work, and a sandbox that cannot start.


@pytest.mark.parametrize(
    ("key", "value"),
    [("timeout_s", float("inf")), ("timeout_s", 1e300), ("cpus", 1e12), ("docker_timeout_s", float("inf")),
     ("memory_mb", 1 << 40), ("cpus", float("nan"))],
)  # fmt: skip
def test_t3_t4_a_number_out_of_range_is_refused_naming_key_and_value(key, value):
    with pytest.raises(ConfigError) as e:
        make_python_tool({key: value})
    assert e.value.key == f"python_sandbox.{key}" and repr(value) in str(e.value)


async def test_t3_an_infinite_timeout_does_not_take_the_runner_down(stateless_pool):
    with pytest.raises(ConfigError, match="timeout_s"):
        await stateless_pool.run("print(1)", timeout_s=float("inf"))
    (before,) = stateless_pool.containers
    ch = stateless_pool._channels[0]
    for timeout in (float("inf"), 1e300):  # sent to the runner as is: it clamps them
        msg = stateless_pool._run_msg("print(1)", timeout)
        r = await stateless_pool._call(stateless_pool._exec(ch, msg, 5.0))
        assert r.ok and r.stdout == "1\n", r
    r = await stateless_pool.run("print(2)")
    assert r.ok and r.stdout == "2\n" and stateless_pool.containers == [before], r


FAST = {"preload": (), "warmup": "", "timeout_s": 1.0}


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"image": "agentenv/no-such-image:29"}, "no-such-image"), ({"cpus": 1000.0}, "could not start a sandbox")],
)
async def test_t4_a_sandbox_that_cannot_start_fails_its_health_check_with_one_clear_error(sandbox_image, kwargs, says):
    tool = PythonTool(PythonSandboxConfig(pool_size=1, **FAST, **kwargs))
    try:
        with pytest.raises(ToolError, match=says):
            await tool.health_check()
        with pytest.raises(ToolError, match=says):  # and a call raises it too: never a silent failed result
            await tool("print(1)")
    finally:
        await tool.aclose()


async def test_t4_the_health_check_runs_in_every_container_and_names_the_one_that_fails(docker_client, sandbox_image):
    tool = PythonTool(PythonSandboxConfig(pool_size=2, **FAST))
    try:
        await tool.health_check()
        first, second = tool.pool.containers
        docker_client.api.pause(second)
        with pytest.raises(ToolError, match=f"container {second[:12]}: the sandbox did not answer") as e:
            await tool.health_check()
        assert first[:12] not in str(e.value)
    finally:
        await tool.aclose()
