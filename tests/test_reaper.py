"""The reaper ends helper processes when their owner dies (SIGKILL included) or releases them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentenv._reaper import Reaper, child_pids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    end = time.monotonic() + timeout
    while any(_running(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


_OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from agentenv._reaper import Reaper, child_pids
    before = child_pids()
    # a child that ignores SIGTERM: only the SIGKILL after the grace period ends it
    kids = [subprocess.Popen([sys.executable, "-c", code]) for code in (
        "import time; time.sleep(600)",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
    )]
    time.sleep(0.5)
    reaper = Reaper(child_pids() - before, grace_s=1.0)
    print(" ".join(str(k.pid) for k in kids), reaper.pid, flush=True)
    time.sleep(600)
    """
)


def test_children_end_when_the_owner_is_killed():
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    *kids, reaper = (int(x) for x in owner.stdout.readline().split())
    assert all(_running(p) for p in (*kids, reaper))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    left = _wait_gone([*kids, reaper])
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left


def test_release_ends_what_is_left_and_the_reaper():
    before = child_pids()
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    reaper = Reaper(child_pids() - before, grace_s=1.0)
    watcher = reaper.pid
    assert watcher is not None and kid.pid in child_pids()
    reaper.release()
    kid.wait(timeout=10)  # ended by the reaper's SIGTERM
    assert kid.returncode == -signal.SIGTERM
    assert not _running(watcher)
    reaper.release()  # idempotent


def test_a_reused_pid_is_not_killed():
    """The reaper matches pid and start time: a process that merely got a dead target's pid is left alone."""
    kid = subprocess.Popen([sys.executable, "-c", "pass"])
    kid.wait()
    reaper = Reaper([kid.pid])  # already gone: nothing to watch
    assert reaper.pid is None
    reaper.release()


_TAGGED_OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from agentenv._reaper import Reaper, tagged
    reaper = Reaper(grace_s=1.0, tag=True)  # armed before any child exists
    with tagged(reaper.tag):
        # a child, and a grandchild it starts itself: both carry the tag from birth
        kid = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            "print(g.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # started after: not ours to reap
    print(kid.pid, kid.stdout.readline().strip(), late.pid, reaper.pid, flush=True)
    time.sleep(600)
    """
)


def test_tagged_children_and_grandchildren_end_when_the_owner_is_killed():
    """No window: whatever starts inside `tagged()` is covered from birth, grandchildren too."""
    owner = subprocess.Popen([sys.executable, "-c", _TAGGED_OWNER], stdout=subprocess.PIPE, text=True)
    kid, grandkid, late, reaper = (int(x) for x in owner.stdout.readline().split())
    assert all(_running(p) for p in (kid, grandkid, late, reaper))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    left = _wait_gone([kid, grandkid, reaper])
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left
    assert _running(late)  # untagged: left alone
    os.kill(late, signal.SIGKILL)


def test_dismissed_reaper_ends_nothing():
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    reaper = Reaper([kid.pid], grace_s=1.0)
    reaper.release(reap=False)
    time.sleep(0.3)
    assert kid.poll() is None
    kid.kill()
    kid.wait()
