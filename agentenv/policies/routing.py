"""The routing key of a `generate` call: which trajectory it serves.

A policy spread over several engines (`agentenv.distributed`) sends the turns
of one trajectory to the engine that served its previous turn, so its prompt's
KV is still in that engine's prefix cache. The rollout engine's `Episode` sets
the key around each call; a fork inherits its parent's key, so an ARPO branch
stays on its parent's engine. A policy with one engine ignores it.
"""

from __future__ import annotations

from contextvars import ContextVar

ROUTE_KEY: ContextVar[str | None] = ContextVar("agentenv_route_key", default=None)
"""The key of the trajectory the current `generate` call serves (None outside an episode)."""
