"""DAPO's reward shaping and filters as pure functions (Yu et al., 2025).

DAPO's loss is GRPO's clipped token loss with a decoupled clip and `token_mean`
(`agentenv.algorithms.grpo.policy_loss`); its advantage is GRPO's.
Shapes: G trajectories of a group; B trajectories, T predicted tokens.
"""

from __future__ import annotations

import torch

# finish reasons of a trajectory cut by a token budget (agentenv.envs.AgentEnv): a turn hit
# max_tokens without a call or an answer (`length`), or the context budget was full (`context`)
OVERLONG_REASONS = ("length", "context")


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, cache_tokens: int) -> torch.Tensor:
    """The soft overlong punishment R_length(|y|): (G,) lengths -> (G,) penalties in [-1, 0].

    0 where |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache up to L_max; -1 beyond.
    """
    lengths = lengths.to(torch.float64)
    ramp = ((max_tokens - cache_tokens) - lengths) / cache_tokens  # (G,)
    return torch.where(lengths > max_tokens, torch.full_like(ramp, -1.0), ramp.clamp(max=0.0))


def informative(rewards: torch.Tensor) -> bool:
    """Whether a group's valid rewards (G,) differ: a group whose rewards are all equal has zero advantage."""
    return rewards.numel() >= 2 and bool(rewards.max() > rewards.min())


def overlong_mask(loss_mask: torch.Tensor, overlong: torch.Tensor) -> torch.Tensor:
    """`loss_mask` (B, T) with the rows of overlong trajectories ((B,) bool) zeroed: overlong filtering."""
    return loss_mask * (~overlong).to(loss_mask.dtype).unsqueeze(1)
