"""The optimizer and its learning-rate schedule: AdamW, linear warmup, then constant or cosine decay (a factor of
`trainer.lr`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal

import torch

from agentenv.configs import OptimizerConfig

LRSchedule = Literal["constant", "cosine"]


def lr_factor(update: int, total: int, warmup: int, schedule: LRSchedule, min_lr_ratio: float = 0.0) -> float:
    """The factor of the base learning rate for optimizer update `update` (0-based) of `total`.

    Warmup rises linearly, (u + 1) / warmup, over the first `warmup` updates; then
    `constant` stays at 1 and `cosine` falls from 1 towards `min_lr_ratio` along half
    a cosine, min + (1 - min) * (1 + cos(pi * p)) / 2 with p = (u - warmup) / (total - warmup),
    as transformers' `get_cosine_schedule_with_warmup` (and verl's `min_lr_ratio`).
    """
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; use 'constant' or 'cosine'")


Params = Iterable[torch.nn.Parameter]


def adamw(
    oc: OptimizerConfig, total: int
) -> tuple[Callable[[Params], torch.optim.Optimizer], Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR]]:
    """AdamW of `oc` and its schedule over `total` optimizer updates, as the two factories that
    `sharding.Strategy.prepare` takes (it makes the optimizer over the parameters it prepared)."""

    def optimizer(params: Params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=oc.lr, weight_decay=oc.weight_decay)

    def scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda u: lr_factor(u, total, oc.warmup_steps, oc.lr_schedule, oc.min_lr_ratio)
        )

    return optimizer, scheduler
