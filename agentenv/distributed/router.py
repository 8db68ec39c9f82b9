"""Which rollout worker serves a `generate` call.

A trajectory's turns go to the worker that served its previous turn (its
prompt is that turn's prompt plus what followed, so the engine's prefix cache
holds most of it); ARPO's forks carry their parent's key, so they stay on its
worker too. A key seen for the first time goes to the least-loaded live worker
(in-flight calls; ties to the one least recently chosen). A worker that is down
gets nothing; its keys move when next seen.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Literal

from agentenv.errors import InfraError

RouteMode = Literal["sticky", "random"]


class Router:
    """Sticky-by-key, least-loaded routing over `n` workers. Not thread-safe (one event loop).

    Args:
        n: Workers.
        mode: `sticky` (the policy above), or `random` (every call to a random live
            worker: the baseline of the prefix-cache benchmark).
        max_keys: Keys remembered (least recently used forgotten first).
        seed: Seed of `random` mode.
    """

    def __init__(self, n: int, mode: RouteMode = "sticky", *, max_keys: int = 100_000, seed: int = 0):
        if n < 1:
            raise ValueError(f"a router needs at least 1 worker, got {n}")
        self.n = n
        self.mode = mode
        self.load = [0] * n
        self.up = [True] * n
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._max_keys = max_keys
        self._last_pick = [0] * n  # pick counter when each worker was last chosen for a new key
        self._picks = 0
        self._rng = random.Random(seed)
        self.sticky_hits = 0
        """Calls routed to the worker that served their key before."""
        self.moved = 0
        """Calls whose key's worker was down, sent elsewhere."""

    def pick(self, key: str | None) -> int:
        """The worker for a call of trajectory `key` (None: a call of no trajectory).

        Raises:
            InfraError: No worker is up.
        """
        live = [i for i in range(self.n) if self.up[i]]
        if not live:
            raise InfraError(f"none of the {self.n} rollout workers is up")
        if self.mode == "random":
            return self._rng.choice(live)
        if key is not None and key in self._keys:
            i = self._keys[key]
            if self.up[i]:
                self._keys.move_to_end(key)
                self.sticky_hits += 1
                return i
            self.moved += 1
        self._picks += 1
        i = min(live, key=lambda j: (self.load[j], self._last_pick[j]))
        self._last_pick[i] = self._picks
        if key is not None:
            self._keys[key] = i
            self._keys.move_to_end(key)
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
        return i

    def started(self, i: int) -> None:
        self.load[i] += 1

    def finished(self, i: int) -> None:
        self.load[i] -= 1

    def mark_down(self, i: int) -> None:
        self.up[i] = False

    def mark_up(self, i: int) -> None:
        self.up[i] = True

    def live(self) -> list[int]:
        return [i for i in range(self.n) if self.up[i]]
