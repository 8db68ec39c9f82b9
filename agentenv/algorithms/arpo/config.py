"""ARPO's validated config: the tree budget, the branching rule, the advantage mode.

The loss fields (clip ranges, aggregation, KL) are GRPO's: `ARPOConfig`
subclasses `GRPOConfig`, so they are declared and validated in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from agentenv.algorithms.grpo.config import GRPOConfig
from agentenv.errors import ConfigError

BranchRule = Literal["threshold", "stochastic"]
AdvantageMode = Literal["soft", "hard", "hard_once"]
ForkDecision = Literal["per_point", "per_fork"]
EntropyNorm = Literal["log_vocab", "none"]


@dataclass(frozen=True)
class ARPOConfig(GRPOConfig):
    """Agentic Reinforced Policy Optimization (Dong et al., 2025, arXiv 2507.19849, section 3).

    Symbols are the paper's. Inherited from GRPOConfig: `normalize_std`,
    `clip_low`, `clip_high`, `loss_agg`, `kl_coef` (the paper: KL 0), and the
    off-policy correction `rollout_correction`, `rollout_correction_level`,
    `rollout_correction_cap`.

    Attributes:
        group_size: M, the global budget: trajectories per task, counting
            every branch (the paper: 16). GRPO's `group_size` at the same value
            samples as many trajectories, so a benchmark compares like with like.
        initial_rollouts: N, trajectories first sampled independently; the
            other M - N are grown by branching (the paper: 8). N = M samples M
            independent trajectories and never branches (the GRPO end of the
            paper's ablation over N): the same trajectories, seed for seed, as
            GRPO's `IndependentSampler` with `group_size` M.
        forks_per_branch: Z, NEW paths forked at one branch point, besides the
            path that continues, so a branch point has Z + 1 paths after it (the
            paper's `Branch(Z)`; default 2). At the end of
            the budget a branch point gets only the slots that are left. (The
            published code's `beam_size` B counts the continuing path too: B - 1
            forks. Its `beam_size: 2` is `forks_per_branch: 1` with
            `fork_decision: per_fork`. The old key `beam_size` is refused with
            this mapping.)
        fork_decision: `per_point` (the paper: one decision at the branch
            point; when it says branch, all Z forks start) or `per_fork` (the
            published code: every one of the Z forks draws its own decision,
            so a branch point gets 0..Z forks). With the deterministic
            `threshold` rule both give the same forks; they differ under the
            `stochastic` rule, where each fork draws its own u.
        alpha: α, base branching probability in P_t = α + β·ΔH_t (the paper: 0.5).
        beta: β, weight of the entropy change in P_t (the paper: 0.2).
        tau: τ, the threshold P_t is compared with (the paper: 0.5).
        entropy_window: k, tokens over which an entropy is averaged: the first k
            of a trajectory give H_initial, the first k after a tool result give
            H_t (the paper: 20). Per-token means, not sums as in the published code.
        branch_rule: `threshold` (the paper: branch when P_t > τ) or
            `stochastic` (the published code: branch with probability
            clip(τ + β·ΔH_t, 0, 1)). Default `threshold`: it is the rule the
            paper states; it is deterministic given the entropies, so a run is
            reproducible and the branch points can be read off the logs; and it
            spends the budget only where entropy rose (with α = τ it branches
            exactly when ΔH_t > 0, whatever the normalization), while with
            normalized ΔH_t the stochastic rule is close to a fair coin
            (|β·ΔH_t| ≤ 0.2) and so mostly ignores the entropy that motivates
            ARPO. No budget is lost when the rule rarely fires: unused slots are
            filled with independent trajectories.
        advantage: `soft` (the paper's default: GRPO's group advantage over all
            M trajectories; shared prefixes get the mean through the loss),
            `hard` (tokens shared by d trajectories get the mean of their d
            advantages, each trajectory's own tokens its own advantage) or
            `hard_once` (as `hard`, and each shared token is counted once in
            the loss: the copies in the branches' rows leave the loss mask).
            Measured finding: with the default `token_mean` loss, `hard` gives
            the same gradient as `soft` on-policy (max |difference| 1.5e-8,
            float rounding; `tests/algorithms/test_arpo_variants.py`), since a
            shared token still appears in each of its d rows, and d times the
            mean of d advantages is the sum of the soft ones (under
            `seq_mean_token_mean` they differ only through the rows' lengths). Only
            `hard_once` changes the update: the token counts once, with the
            mean advantage, and the loss's token count shrinks accordingly
            (under `seq_mean_token_mean`, a branch's row averages over its own
            tokens only). `hard_once` with a KL in the return (`reinforce_pp*`
            with `kl_coef` > 0) is refused: the token's return would hold only
            its carrier's KL tail.
        entropy_norm: How ΔH_t = H_t - H_initial is normalized (the paper
            normalizes ΔH_t without fixing a scale that carries over between
            vocabularies). `log_vocab` divides by ln|V|, the largest possible
            per-token entropy, so ΔH_t lies in [-1, 1] for any model; `none`
            keeps nats (stronger dependence on entropy for the stochastic rule).
        estimator: The trajectory-level advantage over the tree's M
            trajectories, by name (`agentenv.algorithms.core`): `grpo` (the
            paper's; `normalize_std: false` gives `dr_grpo`'s), `dr_grpo`,
            `rloo`, `reinforce_pp` or `reinforce_pp_baseline` (their KL in the
            return, with `kl_coef`, and global whitening run at the batch
            level; no KL term in the loss then). `soft`/`hard` apply to it;
            `normalize_std` matters for `grpo` and `reinforce_pp*` only.
    """

    group_size: int = 16
    initial_rollouts: int = 8
    forks_per_branch: int = 2
    fork_decision: ForkDecision = "per_point"
    alpha: float = 0.5
    beta: float = 0.2
    tau: float = 0.5
    entropy_window: int = 20
    branch_rule: BranchRule = "threshold"
    advantage: AdvantageMode = "soft"
    entropy_norm: EntropyNorm = "log_vocab"
    estimator: str = "grpo"

    renamed_keys: ClassVar[dict[str, str]] = {
        "beam_size": (
            "is now forks_per_branch: Z, the NEW paths forked at a branch point besides the one that continues "
            "(the paper's Branch(Z)). agentenv's old beam_size B meant Z: write forks_per_branch: B. The published "
            "ARPO code's beam_size B counts the continuing path too: write forks_per_branch: B - 1 with "
            "fork_decision: per_fork"
        ),
    }
    """Old keys the loader refuses with a message saying what they became."""

    def __post_init__(self) -> None:
        super().__post_init__()
        M, N = self.group_size, self.initial_rollouts
        if N < 1:
            raise ConfigError("algorithm.initial_rollouts", f"N must be >= 1, got {N}")
        if M < N:
            raise ConfigError(
                "algorithm.initial_rollouts",
                f"N {N} must be <= group_size M {M}: the M - N others are grown by branching (N = M: none)",
            )
        for key in ("forks_per_branch", "entropy_window"):
            if getattr(self, key) < 1:
                raise ConfigError(f"algorithm.{key}", f"must be >= 1, got {getattr(self, key)}")
        for key in ("alpha", "tau"):
            v = getattr(self, key)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ConfigError(f"algorithm.{key}", f"must be a probability in [0, 1], got {v}")
        if not (math.isfinite(self.beta) and self.beta >= 0.0):
            raise ConfigError("algorithm.beta", f"must be a finite number >= 0, got {self.beta}")
        from agentenv.algorithms.core import get_estimator

        est = get_estimator(self.estimator)  # an unknown name: ConfigError naming algorithm.estimator
        if self.advantage == "hard_once" and est.kl_in_return and self.kl_coef > 0:
            raise ConfigError(
                "algorithm.advantage",
                f"hard_once with estimator {self.estimator!r} and kl_coef {self.kl_coef} is not supported: a shared "
                "token counted once would carry only its carrier's KL tail, not the mean over the trajectories "
                "sharing it; use advantage: hard (each copy its own return), or kl_coef: 0",
            )

    @property
    def branch_budget(self) -> int:
        """M - N: the trajectories grown by branching."""
        return self.group_size - self.initial_rollouts
