"""Token spaces: variable-length sequences of token ids as int64 arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces


class TokenSequence(spaces.Sequence):
    """A variable-length sequence of token ids in `[0, vocab_size)`, as an int64 array.

    With `end_token_id` set, an unmasked `sample()` is a random *complete turn*:
    random tokens followed by `end_token_id` (the EOS), the way every policy turn
    ends with EOS or a stop string. This lets gymnasium's `check_env` step an
    `AgentEnv` with random actions without every episode being cut short as an
    unfinished turn.

    Args:
        vocab_size: Number of token ids (`len(tokenizer)`).
        end_token_id: Token that ends a sampled turn, or None for plain samples.
        seed: Seed of the space's own generator.
    """

    def __init__(self, vocab_size: int, end_token_id: int | None = None, seed: Any = None):
        if vocab_size < 1:
            raise ValueError(f"TokenSequence needs vocab_size >= 1, got {vocab_size}")
        super().__init__(spaces.Discrete(vocab_size), stack=True, seed=seed)
        self.vocab_size = vocab_size
        self.end_token_id = end_token_id

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        out = np.asarray(super().sample(mask=mask, probability=probability), dtype=np.int64)
        if self.end_token_id is None or mask is not None or probability is not None:
            return out
        return np.append(out, np.int64(self.end_token_id))

    def __repr__(self) -> str:
        return f"TokenSequence(vocab_size={self.vocab_size}, end_token_id={self.end_token_id})"


def as_token_array(ids: list[int]) -> np.ndarray:
    """A fresh int64 array of token ids (never shared with the env's state)."""
    return np.array(ids, dtype=np.int64)


def action_ids(action: Any, vocab_size: int) -> list[int]:
    """The token ids of an action: a flat sequence of integers in `[0, vocab_size)`.

    Nothing is coerced: a float (1.7 would silently become token 1) or a nested
    array (flattened, it would be another turn) is refused.

    Raises:
        ValueError: The action is not 1-D, holds non-integers, or ids out of range.
    """
    arr = np.asarray(action)
    if arr.size == 0:
        return []
    if arr.ndim != 1:
        raise ValueError(f"an action is a flat sequence of token ids, got an array of shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got {arr.dtype} values (first {arr[:3].tolist()})")
    ids: list[int] = arr.astype(np.int64).tolist()
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"action holds token ids outside [0, {vocab_size}): {bad[:5]}")
    return ids
