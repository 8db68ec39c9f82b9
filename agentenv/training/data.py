"""A resumable, deterministic stream of training tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class TaskStream:
    """Yields tasks in epochs, each a permutation drawn from (seed, epoch).

    The only state is the cursor (tasks consumed so far), so a run resumed
    from a checkpoint draws exactly the batch it would have drawn.
    """

    def __init__(self, tasks: Sequence[Any], seed: int, cursor: int = 0):
        if not tasks:
            raise ValueError("TaskStream needs at least one task")
        self.tasks = list(tasks)
        self.seed = seed
        self.cursor = cursor

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def peek(self, n: int) -> list[Any]:
        out: list[Any] = []
        pos = self.cursor
        while len(out) < n:
            epoch, i = divmod(pos, len(self.tasks))
            out.append(self.tasks[int(self._order(epoch)[i])])
            pos += 1
        return out

    def next_batch(self, n: int) -> list[Any]:
        batch = self.peek(n)
        self.cursor += n
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"checkpoint was written with task seed {state['seed']}, this run uses {self.seed}")
        self.cursor = int(state["cursor"])
