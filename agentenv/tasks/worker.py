"""A verifier worker: a Python process that runs checks and is killed when one runs past its time limit.

A verifier runs on text the model wrote, and some verifiers never return on it
(sympy on `9^{9^{9^9}}`; reasoning-gym's `countdown` on `1e999999` and
`intermediate_integration` on `inf` ran 65-70 s). A thread cannot be stopped;
a process can. `VerifierWorker.call("module:attr", *args, timeout_s=)` runs the
function in a long-lived worker (`python -m agentenv.tasks._mathworker`),
answers its value, and kills and restarts the worker when the call runs past
`timeout_s`. The worker's memory is capped (2 GiB) so a huge expression fails
instead of swapping the host.

Requests go to the worker pickled (the caller is trusted: it names the
function); replies come back as JSON (the worker ran model-written text).
"""

from __future__ import annotations

import atexit
import base64
import contextvars
import json
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

WORKER_MODULE = "agentenv.tasks._mathworker"


class WaitClock:
    """The seconds a scoring spent waiting for the worker (another check holding it, a restart): not its
    check's own time, so the reward gate does not charge them to its limit (`agentenv.tasks.rewards`)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.since: float | None = None  # a wait under way began then (time.monotonic)

    def excused(self) -> float:
        """The seconds waited so far, a wait under way included."""
        since = self.since
        return self.waited + (time.monotonic() - since if since is not None else 0.0)


WAIT_CLOCK: contextvars.ContextVar[WaitClock | None] = contextvars.ContextVar("verifier_wait_clock", default=None)
"""The clock of the scoring now running in this context (set by the reward gate's thread)."""


class VerifierTimeout(Exception):
    """A check ran past its time limit (its worker was killed); the answer it checked scores as wrong."""


class VerifierFailed(Exception):
    """A check raised inside the worker (its message names the exception); the answer scores as wrong."""


def _limit_resources() -> None:
    """Cap the worker's memory (2 GiB) so a huge expression fails instead of swapping the host."""
    try:
        import resource

        cap = 2 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass


def worker_main() -> None:
    """Import the modules named on the command line, then answer base64-pickled `(path, args)` lines on stdin
    with `{"value": ...}` or `{"error": ...}` JSON lines."""
    _limit_resources()
    # The replies get their own copy of stdout; fd 1 goes where stderr goes (nowhere), so a check or an import
    # that prints (tower_of_hanoi's "Error validating move ...") is never read as a reply nor shifts the next
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    import importlib

    import sympy  # noqa: F401  (warm: the first math check should not pay for the import)

    from agentenv.registry import import_string

    for module in sys.argv[1:]:  # what the last worker ran: a restart pays its imports before it is ready
        importlib.import_module(module)

    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        try:
            path, args = pickle.loads(base64.b64decode(line))
            value = import_string(path)(*args)
            reply = json.dumps({"value": value})
        except Exception as e:  # noqa: BLE001 - the caller decides what a failed check means
            reply = json.dumps({"error": f"{type(e).__name__}: {e}"[:300]})
        print(reply, file=replies, flush=True)


class VerifierWorker:
    """A long-lived worker process; killed and restarted when a call runs past its time limit."""

    def __init__(self, start_timeout_s: float = 120.0):
        self._proc: subprocess.Popen | None = None
        self._modules: list[str] = []  # imported by every worker before it is ready: not charged to a call's limit
        self._lock = threading.Lock()
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        """How many times the worker was killed (timeouts, crashes)."""

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, *self._modules],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env,
        )  # fmt: skip
        if self._readline(proc, self.start_timeout_s) is None:
            self._kill(proc)
            raise RuntimeError(f"the verifier worker ({sys.executable} -m {WORKER_MODULE}) did not start")
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any] | None:
        assert proc.stdout is not None  # started with stdout=PIPE
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = proc.stdout.readline()
        return json.loads(line) if line else None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f:
                f.close()

    def call(self, path: str, *args: Any, timeout_s: float) -> Any:
        """`path(*args)` in the worker (`path` is `"module:attr"`; args and value pickle / JSON).

        Raises:
            VerifierTimeout: No answer within `timeout_s` (or the worker died); it was killed and restarts.
            VerifierFailed: The function raised.
        """
        line = base64.b64encode(pickle.dumps((path, args))).decode() + "\n"
        module = path.split(":")[0]
        proc = self._take(module)
        try:
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                reply = self._readline(proc, timeout_s)
            except (BrokenPipeError, OSError, ValueError):
                reply = None
            if reply is None:
                log.debug("%s gave no answer in %.1fs; worker restarted", path, timeout_s)
                self._kill(proc)
                self._proc = None
                self.restarts += 1
                raise VerifierTimeout(f"{path} gave no answer within {timeout_s:g} s (cut off)")
        finally:
            self._lock.release()
        if "error" in reply:
            raise VerifierFailed(reply["error"])
        return reply["value"]

    def _take(self, module: str) -> subprocess.Popen:
        """The worker, held (the lock: one check at a time) and started with `module` imported. The time this
        takes is the scoring's `WaitClock`'s, not the call's (another check holds it; a restart imports)."""
        clock = WAIT_CLOCK.get()
        if clock is not None:
            clock.since = time.monotonic()
        try:
            self._lock.acquire()
            try:
                if module not in self._modules:  # a new module: a fresh worker imports it first, outside the call's limit
                    self._modules.append(module)
                    self._stop()
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                return self._proc
            except BaseException:
                self._lock.release()
                raise
        finally:
            if clock is not None and clock.since is not None:
                clock.waited, clock.since = clock.excused(), None  # the check's own time starts now

    def _stop(self) -> None:
        if self._proc is not None:
            self._kill(self._proc)
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


_worker: VerifierWorker | None = None
_worker_lock = threading.Lock()


def get_worker() -> VerifierWorker:
    """The process-wide verifier worker (started on first use, killed at exit)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = VerifierWorker()
            atexit.register(_worker.close)
        return _worker
