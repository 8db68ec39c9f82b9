"""GSPO's validated config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentenv.algorithms.grpo.config import GroupConfig

_TOKEN_LOSS = "GSPO's loss is a clipped mean over sequences, without a KL term or a per-token correction"


@dataclass(frozen=True)
class GSPOConfig(GroupConfig):
    """Group Sequence Policy Optimization (Zheng et al., 2025, arXiv 2507.18071).

    `group_size` is GRPO's (`GroupConfig`). The token loss's keys of GRPO
    (`loss_agg`, the KL, the rollout and off-policy corrections) are not GSPO's:
    `kl_coef: 0`, `rollout_correction: none` and `off_policy: none` are
    accepted (what GSPO does), other values and the other keys refused.

    Attributes:
        normalize_std: Divide group-centred rewards by the group's std (GSPO's
            advantage is GRPO's group-normalized one); False: mean-centred.
        clip_low: The sequence ratio's clip below 1 (the paper: 3e-4); a
            sequence-level, length-normalized ratio stays near 1, so GSPO's
            ranges are about a thousand times smaller than GRPO's token ones.
        clip_high: The sequence ratio's clip above 1 (the paper: 4e-4).
    """

    normalize_std: bool = True
    clip_low: float = 3e-4
    clip_high: float = 4e-4

    kl_coef: ClassVar[float] = 0.0  # no KL term: no reference model is loaded
    rollout_correction: ClassVar[str] = "none"
    off_policy: ClassVar[str] = "none"
    fixed_keys: ClassVar[dict[str, str]] = {
        "kl_coef": "gspo has no KL term",
        "rollout_correction": "gspo does not reweigh its sequence ratio",
        "off_policy": "gspo's sequence loss has no decoupled form here",
        "rollout_correction_level": _TOKEN_LOSS,
        "rollout_correction_cap": _TOKEN_LOSS,
        "behaviour_weight_cap": _TOKEN_LOSS,
        "loss_agg": "gspo's loss is a mean over sequences",
    }
    """Keys of GRPO's config that GSPO does not take (`agentenv.loader.build_dataclass`)."""
