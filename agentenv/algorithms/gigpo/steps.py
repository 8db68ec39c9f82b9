"""GiGPO's step-level credit (Feng et al., 2025, arXiv 2505.10978, section 4), as pure functions.

A step is one policy turn. Its anchor state is the state it acts from; the
steps of one task's trajectories that act from the same state form an anchor
group (eq. 6), and each step's discounted return (eq. 5) is normalized inside
its group (eq. 7) by GRPO's group normalization (`core.group_advantages`).
GiGPO's advantage is the episode-level one plus ω times this (eq. 8).

Shapes: S steps of one group's valid trajectories, flattened in trajectory order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from difflib import SequenceMatcher

import torch


def discounted_returns(n_steps: int, reward: float, gamma: float) -> torch.Tensor:
    """Eq. 5 with the reward at the last step only: R_t = γ^(T-1-t)·r, (T,) float64."""
    powers = torch.arange(n_steps - 1, -1, -1, dtype=torch.float64)  # (T,) T-1 ... 0
    return float(reward) * float(gamma) ** powers


def exact_anchor_ids(keys: Sequence[Hashable]) -> list[int]:
    """Anchor groups by equal keys: (S,) group ids, numbered in order of first appearance."""
    ids: dict[Hashable, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def similar_anchor_ids(states: Sequence[Sequence[int]], threshold: float) -> list[int]:
    """Anchor groups by similarity (verl-agent's `enable_similarity`): (S,) group ids.

    Steps are placed in order: a step joins the first group whose first member
    it matches with `difflib.SequenceMatcher(None, a, b).ratio() >= threshold`,
    else it opens a new group. The states are token-id sequences (the
    contexts after the prompt, in `GiGPO`; verl-agent
    compares observation strings; the ratio is defined alike on any sequence).
    """
    reps: list[Sequence[int]] = []
    ids: list[int] = []
    for s in states:
        hit = next((g for g, r in enumerate(reps) if SequenceMatcher(None, s, r).ratio() >= threshold), None)
        if hit is None:
            hit = len(reps)
            reps.append(s)
        ids.append(hit)
    return ids


def anchor_group_advantages(
    returns: torch.Tensor, group_ids: Sequence[int], scalars: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Eq. 7: each step's return normalized inside its anchor group by `scalars` ((n,) -> (n,)).

    Args:
        returns: (S,) discounted returns.
        group_ids: (S,) anchor group of each step.
        scalars: A group estimator (GRPO's `(r - mean) / (std + eps)`, or `r - mean`);
            a singleton group gets 0.
    Returns:
        (S,) step-level advantages.
    """
    ids = torch.as_tensor(list(group_ids), dtype=torch.long)  # (S,)
    out = torch.zeros_like(returns)
    for g in ids.unique().tolist():
        members = (ids == g).nonzero().squeeze(-1)
        out[members] = scalars(returns[members])
    return out


def group_sizes(group_ids: Sequence[int]) -> list[int]:
    """(S,) the size of each step's anchor group."""
    counts: dict[int, int] = {}
    for g in group_ids:
        counts[g] = counts.get(g, 0) + 1
    return [counts[g] for g in group_ids]
