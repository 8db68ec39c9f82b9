"""End helper processes when their owner dies, even by SIGKILL.

vLLM runs its engine in child processes. A trainer killed with SIGKILL runs no
cleanup, and the engine lived on as orphans holding cores and memory. A reaper
is a small watchdog process (this module run with `-m`) that holds the read
end of a pipe whose write end only the owner has: when the owner dies, the
pipe reads EOF and the reaper ends the processes it was given (SIGTERM, then
SIGKILL after a grace period). A clean `release()` closes the pipe after the
processes have exited, and the reaper finds nothing left to do.

Processes are named by pid and start time, so a pid the kernel has since
given to another process is never signalled. Linux only (/proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterable


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """Start time (clock ticks since boot) of a living process; None if gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] in "ZX" else fields[19]


def child_pids() -> set[int]:
    """Every living descendant of this process (empty where there is no /proc)."""
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return set()
    parent = {int(n): int(f[1]) for n in names if (f := _stat(int(n))) is not None}
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
        if not targets:
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(grace_s), *targets],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
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


def _watch(grace_s: float, targets: list[tuple[int, str]]) -> None:
    """The reaper's body: wait for EOF on stdin, then end the targets still alive."""
    sys.stdin.buffer.read()  # EOF: the owner closed the pipe or died

    def alive() -> list[int]:
        return [p for p, start in targets if _start_time(p) == start]

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for p in alive():
            try:
                os.kill(p, sig)
            except OSError:
                pass
        end = time.monotonic() + wait_s
        while alive() and time.monotonic() < end:
            time.sleep(0.1)


if __name__ == "__main__":
    _watch(float(sys.argv[1]), [(int(p), s) for p, s in (a.split(":") for a in sys.argv[2:])])
