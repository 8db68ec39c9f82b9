"""State keys: a name for the state an episode stands in before each policy turn.

Two steps with the same key start from the same state, so their outcomes can be
compared as outcomes of the same decision (GiGPO's anchor states). For a
token-level episode the state the policy acts from is its whole context: the
policy reads nothing else, and a deterministic tool's state is a function of
the calls already in the context. `ContextHash` names a context by a hash of
its token ids, updated as the context grows (each token is hashed once), so a
key costs O(1) per turn, and a fork continues its parent's hash.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable

from agentenv.types import Trajectory

KEY_BYTES = 16  # 128-bit keys: a collision among the steps of one group is out of reach


class ContextHash:
    """A running BLAKE2b hash of a token sequence; `key()` names the sequence so far."""

    def __init__(self, tokens: Iterable[int] = ()):
        self._h = hashlib.blake2b(digest_size=KEY_BYTES)
        self.update(tokens)

    def update(self, tokens: Iterable[int]) -> None:
        """Append `tokens` (ids as little-endian int64, so any vocabulary hashes alike)."""
        ids = array("q", tokens)  # (n,) int64
        if sys.byteorder == "big":
            ids.byteswap()
        self._h.update(ids.tobytes())

    def key(self) -> str:
        """The hex key of the tokens appended so far."""
        return self._h.hexdigest()

    def copy(self) -> ContextHash:
        new = ContextHash.__new__(ContextHash)
        new._h = self._h.copy()
        return new


def context_keys(traj: Trajectory) -> list[str]:
    """The key of the context before each policy segment of `traj`, computed from its tokens.

    The same keys `AgentEnv` records (`Trajectory.state_keys`), for a trajectory
    whose env gave none: a token-in, token-out context is the concatenation of
    its segments.
    """
    h, keys = ContextHash(), []
    for seg in traj.segments:
        if seg.source == "policy":
            keys.append(h.key())
        h.update(seg.token_ids)
    return keys
