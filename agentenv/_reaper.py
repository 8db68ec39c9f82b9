"""End what a process started when it dies, even by SIGKILL: helper processes and Docker containers.

A trainer killed with SIGKILL runs no cleanup: vLLM's engine processes lived on
as orphans holding cores and (GPU) memory, and sandbox containers stayed until
the next run started. A reaper is a small watchdog process (this module run with
`-m`) that holds the read end of a pipe whose write end only the owner has:
when the owner dies, the pipe reads EOF and the reaper ends

- the processes it was given by pid (matched with their start time, so a pid
  the kernel has since given to another process is never signalled);
- every process carrying its tag in its environment (`AGENTENV_REAP_TAG`):
  arm the reaper first, then start children inside `tagged(reaper.tag)`, and
  they are covered from the moment they exist, with no window in which a kill
  leaves orphans (children inherit the environment; their own children too);
- every Docker container carrying its label (`key=value`).

Processes get SIGTERM, then SIGKILL after a grace period. `release()` closes the
pipe on purpose (the reaper then ends what is left); `release(reap=False)`
dismisses it. Linux only (/proc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

TAG_VAR = "AGENTENV_REAP_TAG"
_DISMISS = b"dismiss"


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


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def child_pids() -> set[int]:
    """Every living descendant of this process (empty where there is no /proc)."""
    parent = {p: int(f[1]) for p in _pids() if (f := _stat(p)) is not None}
    found: set[int] = set()
    frontier = [os.getpid()]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def tagged_pids(tag: str, var: str = TAG_VAR) -> list[int]:
    """Living processes whose environment holds `var=tag` (`AGENTENV_REAP_TAG` by default; readable ones: ours)."""
    needle = f"{var}={tag}".encode()
    out = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and _start_time(pid) is not None:
            out.append(pid)
    return out


@contextlib.contextmanager
def tagged(tag: str) -> Iterator[None]:
    """Children started inside carry `tag` in their environment (and pass it to theirs).

    The environment is the process's: children another thread starts meanwhile
    carry the tag too, and are reaped with the owner's.
    """
    with scoped_env(TAG_VAR, tag):
        yield


@contextlib.contextmanager
def scoped_env(key: str, value: str) -> Iterator[None]:
    """`os.environ[key] = value` inside, its old value (or none) after."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


class Reaper:
    """Ends `pids`, the processes tagged `tag` and the containers labelled `docker_label`
    when this process dies or `release()` is called.

    Args:
        pids: Processes to end (typically children started by a library).
        grace_s: Seconds between SIGTERM and SIGKILL.
        tag: Reap processes started inside `tagged(reaper.tag)`; True makes a fresh tag.
        docker_label: `key=value`: containers with this label are removed (force).
    """

    def __init__(
        self,
        pids: Iterable[int] = (),
        grace_s: float = 5.0,
        *,
        tag: str | bool | None = None,
        docker_label: str | None = None,
    ):
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}" if tag is True else (tag or None)
        targets = [f"{p}:{s}" for p in sorted(set(pids)) if (s := _start_time(p)) is not None]
        self._proc: subprocess.Popen | None = None
        if not targets and self.tag is None and docker_label is None:
            return
        args = [sys.executable, "-m", __name__, str(grace_s), self.tag or "-", docker_label or "-", *targets]
        env = {k: v for k, v in os.environ.items() if k != TAG_VAR}  # never reap the reaper
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C to the owner's group leaves the reaper to do its job
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def release(self, timeout: float = 30.0, *, reap: bool = True) -> None:
        """Close the pipe: the reaper ends whatever is left (or nothing, with `reap=False`) and exits. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None  # started with stdin=PIPE
            if not reap:
                proc.stdin.write(_DISMISS)
            proc.stdin.close()
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()


_CONTAINER_REAPERS: dict[str, Reaper] = {}


def reap_containers_on_exit(label: str) -> None:
    """Remove the Docker containers labelled `label` (`key=value`) when this process ends, SIGKILL included.

    Idempotent: one reaper per label per process, never released (it wakes when
    the process is gone and finds nothing left after a clean exit).
    """
    if label not in _CONTAINER_REAPERS or _CONTAINER_REAPERS[label].pid is None:
        _CONTAINER_REAPERS[label] = Reaper(docker_label=label)


def _forget_reapers() -> None:  # a forked child does not own its parent's reapers
    _CONTAINER_REAPERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reapers)


def end_tagged(tag: str, var: str = TAG_VAR, grace_s: float = 2.0) -> None:
    """End now every process whose environment holds `var=tag`: SIGTERM, then SIGKILL after `grace_s`."""
    _end(lambda: tagged_pids(tag, var), grace_s)


def _end(alive: Callable[[], list[int]], grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for p in alive():
            try:
                os.kill(p, sig)
            except OSError:
                pass
        end = time.monotonic() + wait_s
        while alive() and time.monotonic() < end:
            time.sleep(0.05)


def _remove_containers(label: str) -> None:
    try:
        import docker

        client = docker.from_env(timeout=30)
        for c in client.api.containers(all=True, filters={"label": label}):
            with contextlib.suppress(Exception):
                client.api.remove_container(c["Id"], force=True)
    except Exception:  # noqa: BLE001 - no daemon: nothing of ours runs there
        pass


def _watch(grace_s: float, tag: str | None, label: str | None, targets: list[tuple[int, str]]) -> None:
    """The reaper's body: wait for EOF on stdin, then end what is still alive."""
    if sys.stdin.buffer.read() == _DISMISS:  # EOF: the owner closed the pipe or died
        return

    def alive() -> list[int]:
        mine = [p for p, start in targets if _start_time(p) == start]
        return mine + [p for p in tagged_pids(tag) if p not in mine] if tag else mine

    if label:
        _remove_containers(label)
    _end(alive, grace_s)


if __name__ == "__main__":
    grace, tag_arg, label_arg, *rest = sys.argv[1:]
    _watch(
        float(grace),
        None if tag_arg == "-" else tag_arg,
        None if label_arg == "-" else label_arg,
        [(int(p), s) for p, s in (a.split(":") for a in rest)],
    )
