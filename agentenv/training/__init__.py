"""Training: the Accelerate trainer, checkpoints, metrics, evaluation.

Heavy modules (accelerate, transformers) load on first use of `Trainer`/`train`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Trainer", "train", "evaluate", "EvalReport"]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "train", "TrainResult"):
        from agentenv.training import trainer

        return getattr(trainer, name)
    if name in ("evaluate", "EvalReport", "summarize"):
        from agentenv.training import evaluate as ev

        return getattr(ev, name)
    raise AttributeError(name)
