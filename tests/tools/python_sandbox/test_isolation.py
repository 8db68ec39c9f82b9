"""One episode attacks another in the same container, as an attacker would: it reads the
other's code and output, plants modules in its directory, writes into its pipes, signals
or prlimits PID 1 and the other's processes, leaves threads, shared memory, message queues
and SysV segments behind, and forges control messages. Every attack fails and the victim's
result is intact, in stateless and in session mode, with the victims running concurrently
(the fixtures' pools have one container each, so attacker and victim always share it)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentenv.tools.python_sandbox import SessionLost

pytestmark = pytest.mark.docker

SLOW_S = 15.0  # timeout of the calls that scan their own memory


def token() -> str:
    return uuid.uuid4().hex


# Scans the readable anonymous memory of its own process for `VICTIM-SECRET:<32 hex>` and
# prints what it found. It holds one such string of its own (the control), so a scan that
# works always finds at least that one.
MEMSCAN = """
import ctypes, re
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: our own /proc/self/mem is ours to read
pat = re.compile(rb'VICTIM-SECRET:([0-9a-f]{32})')
control = ('VICTIM-' + 'SECRET:' + 'c0ffee' * 5 + 'c0').encode()
found = set()
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        parts = line.split()
        if parts[1][0] != 'r' or (len(parts) > 5 and parts[5] not in ('[heap]', '[stack]')):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split('-'))
        for at in range(lo, hi, 32 << 20):
            try:
                mem.seek(at)
                data = mem.read(min(hi, at + (32 << 20)) - at)
            except (OSError, ValueError, OverflowError):
                break
            found.update(m.decode() for m in pat.findall(data))
print(sorted(found))
"""
CONTROL = "c0ffee" * 5 + "c0"


def secret_code(tok: str, hold_s: float = 0.0) -> str:
    """A victim whose code, stdout and stderr all hold the secret (and that may stay in flight)."""
    return (
        f"import sys, time\nsecret = 'VICTIM-' + 'SECRET:' + '{tok}'\n"
        f"print(secret, flush=True)\nprint(secret, file=sys.stderr, flush=True)\ntime.sleep({hold_s})\nsecret"
    )


# Every process but itself (and its own session head), PID 1 included, is a target: it is
# signalled, stopped, its limits lowered, its priority dropped, its pipes written into and its
# memory, environment and cwd opened. Prints the attacks that worked.
ATTACK_PROCESSES = """
import os, resource, signal
def uid_of(p):
    try:
        return int(next(l for l in open(f'/proc/{p}/status') if l.startswith('Uid:')).split()[1])
    except (OSError, StopIteration):
        return None
skip = {os.getpid()} | ({os.getppid()} if uid_of(os.getppid()) == os.getuid() else set())
targets = sorted({1} | {int(p) for p in os.listdir('/proc') if p.isdigit()} - skip)
hits = []
for p in targets:
    for fd in range(0, 8):
        try:
            with open(f'/proc/{p}/fd/{fd}', 'w') as f:
                f.write('FORGED LINE\\n')
            hits.append(('write fd', p, fd))
        except OSError:
            pass
    for what in ('mem', 'environ'):
        try:
            open(f'/proc/{p}/{what}', 'rb').read(1)
            hits.append(('read ' + what, p))
        except OSError:
            pass
    try:
        os.listdir(f'/proc/{p}/cwd')
        hits.append(('cwd', p))
    except OSError:
        pass
    for name, lim, val in (('nofile', resource.RLIMIT_NOFILE, (8, 8)), ('nproc', resource.RLIMIT_NPROC, (1, 1)),
                           ('fsize', resource.RLIMIT_FSIZE, (0, 0)), ('as', resource.RLIMIT_AS, (200 << 20,) * 2)):
        try:
            resource.prlimit(p, lim, val)
            hits.append(('prlimit ' + name, p))
        except (OSError, ValueError):
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, p, 19)
        hits.append(('nice', p))
    except OSError:
        pass
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(p, sig)
            hits.append(('kill %d' % sig, p))
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal (not itself)
except OSError:
    pass
print(len(targets), hits)
"""

# CPU seconds that the processes running user code (all but PID 1, root's and this one)
# use in one second: a stopped or dead episode uses none.
CPU_OF_OTHERS = """
import os, time
def cpu():
    total = 0
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) in (1, os.getpid()):
            continue
        try:
            stat = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
            uid = next(l for l in open(f'/proc/{p}/status') if l.startswith('Uid:')).split()[1]
        except (OSError, StopIteration):
            continue
        if uid != '0':
            total += int(stat[11]) + int(stat[12])
    return total / os.sysconf('SC_CLK_TCK')
a = cpu()
time.sleep(1.0)
print(round(cpu() - a, 2))
"""


async def cpu_of_others(pool) -> float:
    r = await pool.run(CPU_OF_OTHERS, timeout_s=5)
    assert r.ok, r
    return float(r.stdout)


# ---------------------------------------------------------------------------
# Reading another episode's code and output out of memory.


async def test_a_call_cannot_read_the_previous_calls_code_or_output(stateless_pool):
    tok = token()
    victim = await stateless_pool.run(secret_code(tok))
    assert victim.ok and tok in victim.stdout and tok in victim.stderr
    r = await stateless_pool.run(MEMSCAN, timeout_s=SLOW_S)
    assert r.ok, r
    assert CONTROL in r.stdout, "the scan does not work"
    assert tok not in r.stdout, "the next call read the previous call's data from its memory"


async def test_a_new_session_or_call_cannot_read_a_concurrent_sessions_code_or_output(session_pool):
    tok = token()
    victim = await session_pool.open_session()
    try:
        in_flight = asyncio.create_task(victim.run(secret_code(tok, hold_s=2.0), timeout_s=10))
        await asyncio.sleep(0.5)  # the victim's code and first output are in the container now
        attacker = await session_pool.open_session()  # a new head: whatever it was forked from
        try:
            r_session = await attacker.run(MEMSCAN, timeout_s=SLOW_S)
        finally:
            await attacker.aclose()
        r_call = await session_pool.run(MEMSCAN, timeout_s=SLOW_S)  # a stateless call beside it
        v = await in_flight
    finally:
        await victim.aclose()
    for r in (r_session, r_call):
        assert r.ok and CONTROL in r.stdout, r
        assert tok not in r.stdout, "another episode's in-flight code or output was in the attacker's memory"
    assert v.ok and v.stdout.count(tok) == 2 and tok in v.stderr  # printed, then the last expression


# ---------------------------------------------------------------------------
# Files: reading, listing, planting modules.

PROBE_FILES = """
import os
hits = []
try:
    hits.append(('list /work', os.listdir('/work')))
except OSError:
    pass
for path in TARGETS:
    try:
        hits.append(('list', os.listdir(path)))
    except OSError:
        pass
    try:
        hits.append(('read', open(os.path.join(path, 'secret.txt')).read()))
    except OSError:
        pass
    try:
        open(os.path.join(path, 'statistics.py'), 'w').write('def mean(xs):\\n    return 999\\n')
        hits.append(('planted', path))
    except OSError:
        pass
    try:
        open(os.path.join(path, 'secret.txt'), 'w').write('overwritten')
        hits.append(('overwrote', path))
    except OSError:
        pass
print(hits)
"""


async def test_episodes_cannot_read_list_or_plant_in_each_others_directories(session_pool):
    victim = await session_pool.open_session()
    attacker = await session_pool.open_session()
    try:
        r = await victim.run("import os\nopen('secret.txt', 'w').write('s3cr3t')\nprint(os.getcwd())")
        home = r.stdout.strip()
        assert r.ok and home.startswith("/work/")
        probe = f"TARGETS = [{home!r}]\n" + PROBE_FILES
        for attack in (attacker.run(probe), session_pool.run(probe)):  # a session, then a stateless call
            r = await attack
            assert r.ok and r.stdout.strip() == "[]", f"an attack on the victim's directory worked: {r.stdout}"
        r = await victim.run(
            "import statistics, sys, os\n"
            "print(statistics.mean([1, 2, 3]), open('secret.txt').read(), '' in sys.path, os.getcwd() in sys.path)"
        )
        assert r.ok and r.stdout == "2 s3cr3t False False\n", r
    finally:
        await victim.aclose()
        await attacker.aclose()


# ---------------------------------------------------------------------------
# Processes: signals, limits, pipes, memory, PID 1.


async def test_episodes_cannot_signal_prlimit_or_write_into_each_other_or_pid_1(session_pool):
    victim = await session_pool.open_session()
    attacker = await session_pool.open_session()
    try:
        await victim.run("kept = 'intact'")
        # The victim execs a program while the attacks run: an exec'd program is dumpable again,
        # so only the uid keeps its stdout pipe (its fd 1) out of the attacker's reach.
        victim_cell = asyncio.create_task(
            victim.run(
                "import subprocess\np = subprocess.Popen(['sleep', '3'])\nprint('start', flush=True)\n"
                "p.wait()\nprint('end', p.returncode)",
                timeout_s=10,
            )
        )
        await asyncio.sleep(0.7)
        for name, attack in (
            ("session", attacker.run(ATTACK_PROCESSES, timeout_s=10)),
            ("stateless call", session_pool.run(ATTACK_PROCESSES, timeout_s=10)),
        ):
            r = await attack
            assert r.ok, (name, r)
            n, hits = r.stdout.split(" ", 1)
            assert int(n) >= 3 and hits.strip() == "[]", f"attacks of a {name} that worked: {hits}"
        v = await victim_cell
        assert v.ok and v.stdout == "start\nend 0\n", v  # nothing forged into its output, its program not killed
        r = await victim.run("kept")
        assert r.ok and r.stdout == "'intact'\n"
    finally:
        await victim.aclose()
        await attacker.aclose()
    # PID 1's limits are untouched: later calls open files, write, fork and allocate as before.
    r = await session_pool.run(
        "import os, subprocess\nfs = [open('/dev/null') for _ in range(100)]\n"
        "open('f', 'w').write('x' * 100000)\nsubprocess.run(['true'], check=True)\n"
        "b = bytearray(300 << 20)\nprint(len(fs), os.path.getsize('f'), len(b) >> 20)"
    )
    assert r.ok and r.stdout == "100 100000 300\n", r


async def test_kill_minus_one_reaches_only_the_callers_own_processes(session_pool, stateless_pool):
    victims = [await session_pool.open_session() for _ in range(2)]
    attacker = await session_pool.open_session()
    try:
        for i, v in enumerate(victims):
            await v.run(f"v = {i}")
        for attack in (attacker.run, session_pool.run):
            r = await attack("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('sent')")
            assert r.ok and r.stdout == "sent\n"
        for i, v in enumerate(victims):
            r = await v.run("v")
            assert r.ok and r.stdout == f"{i}\n", r
        r = await attacker.run("'alive'")  # its own head died, the cell became the head
        assert r.ok and r.stdout == "'alive'\n"
    finally:
        for s in (*victims, attacker):
            await s.aclose()
    before = (await stateless_pool.run("print(1)")).container
    r = await stateless_pool.run("import os, signal\nos.kill(-1, signal.SIGKILL)\nos.kill(1, signal.SIGKILL)")
    assert (await stateless_pool.run("print(2)")).stdout == "2\n"
    assert r.container == before == stateless_pool.containers[0][:12]


# ---------------------------------------------------------------------------
# Nothing outlives its call: threads, forged "done", shared memory.


async def test_a_cells_threads_do_not_outlive_it(session_pool, proto):
    attacker = proto.fork()
    victim = proto.fork()
    try:
        await victim("n = 0")
        r = await attacker(
            "import threading, time, os\n"
            "def burn():\n    while True:\n        pass\n"
            "def spy():\n    while True:\n        try:\n            os.listdir('/work')\n"
            "        except OSError:\n            pass\n        time.sleep(0.01)\n"
            "for f in (burn, spy):\n    threading.Thread(target=f, daemon=True).start()\n"
            "keep = 'kept'\nthreading.active_count()"
        )
        assert r.ok and r.text == "3"
        assert await cpu_of_others(session_pool) < 0.2, "a thread of the finished cell is still running"
        r = await attacker("import threading\nprint(threading.active_count(), keep)")
        assert r.ok and r.text == "1 kept"  # the variables survived, the threads did not
        r = await victim("n += 1\nn")
        assert r.ok and r.text == "1"
    finally:
        await attacker.aclose()
        await victim.aclose()


# Finds its cell's id on the stack, sends a forged "done" (and for the old protocol its
# fields) on every socket it holds, then keeps computing.
FORGE_DONE = """
import json, os, socket, stat, sys, time
f, rid = sys._getframe(), None
while f is not None and rid is None:
    rid = f.f_locals.get('rid')
    f = f.f_back
print('forging', rid is not None, flush=True)  # before: what a cell prints after its "done" is not its output
for fd in range(3, 64):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            s = socket.socket(fileno=os.dup(fd))
            s.send(json.dumps({'t': 'done', 'rid': rid, 'head': os.getpid(), 'exit': EXIT, 'error': ERROR,
                               'pgid': os.getpgid(0)}).encode())
    except OSError:
        pass
t = time.time()
while time.time() - t < 8:
    pass
"""


async def test_a_forged_done_does_not_let_a_cell_run_past_its_call(session_pool):
    attacker = await session_pool.open_session()
    victim = await session_pool.open_session()
    try:
        await victim.run("v = 'intact'")
        t0 = time.monotonic()
        r = await attacker.run(FORGE_DONE.replace("EXIT", "0").replace("ERROR", "None"), timeout_s=2)
        assert time.monotonic() - t0 < 2 + 2
        assert r.stdout == "forging True\n", r
        assert await cpu_of_others(session_pool) < 0.2, "the cell kept running after its call answered"
        # The forger's session resumes into its loop, not into the head: its next call is its last.
        t0 = time.monotonic()
        try:
            r = await attacker.run("1 + 1", timeout_s=2)
            assert not r.ok and r.session_lost, r
        except SessionLost:
            pass
        assert time.monotonic() - t0 < 2 + 2
        r = await victim.run("v")
        assert r.ok and r.stdout == "'intact'\n"
    finally:
        await attacker.aclose()
        await victim.aclose()


async def test_a_forged_status_of_the_wrong_types_is_an_error_result(proto):
    attacker = proto.fork()
    try:
        r = await attacker(FORGE_DONE.replace("EXIT", "None").replace("ERROR", "['not', 'a', 'str']"))
        assert not r.ok and isinstance(r.error, str) and isinstance(r.text, str), r
    finally:
        await attacker.aclose()


async def test_a_thread_hog_leaves_room_for_the_other_sessions(session_pool):
    attacker = await session_pool.open_session()
    try:
        hog = asyncio.create_task(
            attacker.run(
                "import threading, time\nthreading.stack_size(65536)\nev = threading.Event()\nn = 0\n"
                "try:\n    while n < 100000:\n        threading.Thread(target=ev.wait, daemon=True).start()\n"
                "        n += 1\nexcept RuntimeError:\n    pass\nprint(n, flush=True)\ntime.sleep(3)",
                timeout_s=10,
            )
        )
        await asyncio.sleep(1.0)
        victims = [await session_pool.open_session() for _ in range(4)]
        try:
            code = "x = {}\nimport subprocess\nsubprocess.run(['true'])\nx"
            results = await asyncio.gather(*(v.run(code.format(i)) for i, v in enumerate(victims)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)], results
        finally:
            for v in victims:
                await v.aclose()
        r = await hog
        assert 0 < int(r.stdout) < session_pool.config.pids_limit, r  # its own uid's limit stopped it
    finally:
        await attacker.aclose()


# Tries to make every kind of IPC object another episode could find by name or id; prints what it made.
IPC_LEAK = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
made = []
for size in (120 << 20, 4 << 20):
    if libc.shmget(0, size, 0o1000 | 0o600) >= 0:  # IPC_PRIVATE, IPC_CREAT
        made.append(('shm', size >> 20))
for name, make in (('msg', lambda: libc.msgget(0, 0o1000 | 0o600)), ('sem', lambda: libc.semget(0, 1, 0o1000 | 0o600)),
                   ('mq', lambda: libc.mq_open(b'/leakq', os.O_CREAT | os.O_RDWR, 0o600, None))):
    if make() >= 0:
        made.append(name)
try:
    open('/dev/shm/leak', 'wb').write(b'x' * (4 << 20))
    made.append('/dev/shm')
except OSError:
    pass
print(made)
"""
IPC_LEFT = (
    "import os\nprint(os.listdir('/dev/shm'), os.listdir('/dev/mqueue'), "
    "len(open('/proc/sysvipc/shm').readlines()) - 1, len(open('/proc/sysvipc/msg').readlines()) - 1)"
)


async def test_no_call_or_session_can_make_shared_memory_queues_or_sysv_objects(stateless_pool, session_pool):
    # Their names and ids are shared by every episode of a container, so there are none (issue 29).
    session = await session_pool.open_session()
    try:
        for run in (stateless_pool.run, session.run):
            r = await run(IPC_LEAK)
            assert r.ok and r.stdout == "[]\n", f"made: {r.stdout} {r.stderr}"
            r = await run(IPC_LEFT)
            assert r.ok and r.stdout == "[] [] 0 0\n", f"left: {r.stdout}"
    finally:
        await session.aclose()
    for _ in range(3):  # the memory is all there: 300 MiB fit in the 512 MiB container, call after call
        r = await stateless_pool.run("b = bytearray(300 << 20)\nprint(len(b) >> 20)")
        assert r.ok and r.stdout == "300\n", r


async def test_the_tool_reports_a_timeout_that_also_lost_the_session(proto):
    ep = proto.fork()
    try:
        # The cell kills its own head, then runs past its timeout: once the cell is killed too,
        # nothing holds the variables, so the timeout also loses the session; the model reads both.
        r = await ep("import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(30)")
        assert not r.ok and r.metadata["timed_out"] and r.metadata["session_lost"], r
        assert "TimeoutError" in r.text and "SessionError" in r.text and "define your variables again" in r.text
    finally:
        await ep.aclose()


async def test_a_flood_on_the_status_pipe_is_bounded(stateless_pool):
    before = (await stateless_pool.run("print(1)")).container
    # Every pipe the call holds but its stdout and stderr (its status pipe among them) gets 16 MiB of junk.
    r = await stateless_pool.run(
        "import os, stat\nn = 0\nfor fd in range(3, 64):\n    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n            os.set_blocking(fd, False)\n"
        "            for _ in range(256):\n                n += os.write(fd, b'{' * 65536)\n"
        "    except OSError:\n        pass\nprint(n > 0)",
        timeout_s=10,
    )
    assert r.exit_code == 0 and r.stdout == "True\n" and r.container == before, r  # its exit status answered
    assert (await stateless_pool.run("print(2)")).stdout == "2\n"
