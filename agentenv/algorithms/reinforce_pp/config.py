"""REINFORCE++'s validated config."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.algorithms.grpo.config import GRPOConfig


@dataclass(frozen=True)
class ReinforcePPConfig(GRPOConfig):
    """REINFORCE++ (Hu, 2025, arXiv 2501.03262), and its `-baseline` variant.

    The other fields are GRPO's (`GRPOConfig`): `group_size` (samples per
    prompt), `clip_low`, `clip_high` (the PPO clipped surrogate; the paper:
    0.2), `loss_agg`, the rollout correction.

    Attributes:
        kl_coef: beta, the per-token k1 KL penalty to the reference model folded
            into the token-level return, G_t = r - beta * sum_{s >= t} KL_s (the
            paper: 0.01 for RLHF; 0 loads no reference model). It is not also a
            KL term in the loss.
        normalize_std: Divide the returns by their std over the global batch
            (every policy token of every process) after subtracting the global
            mean (the paper's advantage normalization); False only centres them.
    """

    kl_coef: float = 0.01
    normalize_std: bool = True
