"""ARPO's entropy-based branching rule (arXiv 2507.19849, section 3.2), as pure functions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from agentenv.algorithms.arpo.config import BranchRule, EntropyNorm, ForkDecision


def window_entropy(entropies: Sequence[float], k: int) -> float:
    """Mean per-token entropy of the first k tokens (all of them when fewer than k)."""
    window = list(entropies[:k])
    if not window:
        raise ValueError("window_entropy needs at least one token")
    return sum(window) / len(window)


def entropy_scale(norm: EntropyNorm, vocab_size: int) -> float:
    """The divisor that normalizes ΔH: ln|V| (the largest per-token entropy) or 1."""
    if norm == "log_vocab":
        if vocab_size < 2:
            raise ValueError(f"entropy_norm 'log_vocab' needs a vocabulary of >= 2 tokens, got {vocab_size}")
        return math.log(vocab_size)
    return 1.0


def should_branch(
    h_t: float,
    h_initial: float,
    *,
    alpha: float,
    beta: float,
    tau: float,
    rule: BranchRule,
    u: float,
    scale: float = 1.0,
) -> bool:
    """Decide whether to branch at the node right after a tool result.

        ΔH_t = (H_t - H_initial) / scale          # H: mean entropy over k tokens
        P_t  = α + β·ΔH_t
        threshold  (the paper):          branch iff P_t > τ
        stochastic (the published code): branch iff u - β·ΔH_t <= τ,
                                         i.e. with probability clip(τ + β·ΔH_t, 0, 1)

    Args:
        h_t: H_t, mean entropy of the first k tokens generated after the tool result.
        h_initial: H_initial, mean entropy of the trajectory's first k tokens.
        alpha, beta, tau: α, β, τ.
        rule: `threshold` or `stochastic`.
        u: A uniform draw in [0, 1) (used by `stochastic` only), so the function stays pure.
        scale: Normalizer of ΔH (see `entropy_scale`).
    """
    delta_h = (h_t - h_initial) / scale
    if rule == "threshold":
        return alpha + beta * delta_h > tau
    if rule == "stochastic":
        return u - beta * delta_h <= tau
    raise ValueError(f"unknown branch rule {rule!r}; use 'threshold' or 'stochastic'")


def fork_count(z: int, decision: ForkDecision, draws: Sequence[float], branch: Callable[[float], bool]) -> int:
    """How many of a branch point's Z forks start (before the budget caps them).

    Args:
        z: Z, `forks_per_branch`.
        decision: `per_point` (the paper: one decision on `draws[0]`, then Z
            forks or none) or `per_fork` (the published code: fork c starts
            when `branch(draws[c])`, so 0..Z forks).
        draws: Uniform draws in [0, 1): 1 for `per_point`, Z for `per_fork`.
        branch: The rule at this point as a function of the draw
            (`should_branch` with the entropies bound).
    """
    need = 1 if decision == "per_point" else z
    if len(draws) != need:
        raise ValueError(f"fork_decision {decision!r} with Z={z} needs {need} draws, got {len(draws)}")
    if decision == "per_point":
        return z if branch(draws[0]) else 0
    if decision == "per_fork":
        return sum(bool(branch(u)) for u in draws)
    raise ValueError(f"unknown fork decision {decision!r}; use 'per_point' or 'per_fork'")
