"""RLOO's advantage, a pure function. Shapes: G trajectories of a group."""

from __future__ import annotations

import torch

from agentenv.algorithms.estimators import Estimator


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r)): (G,) -> (G,).

    Each sample's baseline is the others' mean, so it does not depend on the
    sample itself (an unbiased baseline). A single sample has no baseline: 0.
    """
    G = rewards.numel()
    if G < 2:
        return torch.zeros_like(rewards)
    others = (rewards.sum() - rewards) / (G - 1)  # (G,)
    return rewards - others


RLOO_ESTIMATOR = Estimator(scalars=leave_one_out_advantages)
