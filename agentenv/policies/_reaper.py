"""End helper processes when their owner dies, even by SIGKILL.

vLLM runs its engine in child processes. A trainer killed with SIGKILL runs no
cleanup, and the engine lived on as orphans holding cores and memory. A reaper
is a small watchdog process that holds the read end of a pipe whose write end
only the owner has: when the owner dies, the pipe reads EOF and the reaper
ends the processes it was given (SIGTERM, then SIGKILL after a grace period).
A clean `close()` closes the pipe after the processes have exited, and the
reaper finds nothing left to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterable

# Runs in a fresh interpreter: standard library only (psutil is optional there).
_WATCH = r"""
import os, signal, sys, time

def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]  # a zombie is done

targets = [(int(p), s) for p, s in (a.split(":") for a in sys.argv[2:])]
grace = float(sys.argv[1])
sys.stdin.buffer.read()  # EOF: the owner closed the pipe or died

def alive():
    return [p for p, s in targets if start_time(p) == s]  # same start time: not a reused pid

for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
    pids = alive()
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
"""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def child_pids() -> set[int]:
    """Every living descendant of this process (Linux /proc; empty elsewhere)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    parent: dict[int, int] = {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    frontier = [os.getpid()]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


class Reaper:
    """Ends `pids` when this process dies or `release()` is called.

    Args:
        pids: Processes to end (typically children started by a library).
        grace_s: Seconds between SIGTERM and SIGKILL.
    """

    def __init__(self, pids: Iterable[int], grace_s: float = 5.0):
        targets = [f"{p}:{s}" for p in sorted(set(pids)) if (s := _start_time(p)) is not None]
        self._proc: subprocess.Popen | None = None
        if not targets or not sys.platform.startswith("linux"):
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WATCH, str(grace_s), *targets],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C to the owner's group leaves the reaper to do its job
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def release(self, timeout: float = 30.0) -> None:
        """Close the pipe: the reaper ends whatever is left of `pids` and exits. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
