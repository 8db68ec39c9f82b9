"""A token bucket shared by every episode that holds the same tool."""

from __future__ import annotations

import asyncio
import threading
import time


class TokenBucket:
    """At most `rate` acquisitions per second on average, bursts up to `burst`.

    Implemented as GCRA (virtual scheduling): each `acquire` reserves the next
    free slot at once and sleeps until it, so waiters are served in arrival order
    and no lock is held across an await. It binds to no event loop, so one bucket
    serves every episode of a rollout (they share the tool, whose `fork()`
    returns itself) and survives `asyncio.run` being called per step.

    Args:
        rate: Tokens added per second (> 0).
        burst: Bucket size: how many calls may go at once after an idle spell (>= 1).
    """

    def __init__(self, rate: float, burst: int = 1):
        if not rate > 0:
            raise ValueError(f"TokenBucket.rate must be > 0, got {rate!r}")
        if burst < 1:
            raise ValueError(f"TokenBucket.burst must be >= 1, got {burst!r}")
        self.rate = float(rate)
        self.burst = int(burst)
        self._interval = 1.0 / self.rate
        self._tat = 0.0  # theoretical arrival time of the next conforming call
        self._lock = threading.Lock()
        self.waited_s = 0.0
        """Total time callers spent waiting for a token (for metrics)."""

    def reserve(self) -> float:
        """Take the next slot; return how long the caller must wait for it (seconds)."""
        with self._lock:
            now = time.monotonic()
            tat = max(self._tat, now)
            # A call conforms when tat - now <= (burst - 1) * interval.
            wait = max(0.0, tat - (self.burst - 1) * self._interval - now)
            self._tat = tat + self._interval
            self.waited_s += wait
            return wait

    async def acquire(self) -> None:
        """Wait for a token."""
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)
