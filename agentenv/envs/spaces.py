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
