"""The shared algorithm math, as pure functions on tensors, and the advantage estimators and policy losses by name.

Every algorithm builds on these: group advantages (GRPO's, Dr. GRPO's mean-centred,
RLOO's leave-one-out, REINFORCE++'s outcome and group-mean baselines), the
token-level return with the KL folded in and its global whitening
(REINFORCE++), the PPO clipped surrogate, the k3 KL estimator, rollout-correction
weights, the loss aggregations (token mean, sequence mean, Dr. GRPO's constant
normalizer) and `policy_loss`, the clipped loss that GRPO, DAPO, ARPO, Dr. GRPO,
RLOO and REINFORCE++ share.

An estimator turns the rewards of one group's valid trajectories, (G,), into
one advantage each, (G,), and may add a batch-level step that a group cannot do
alone (REINFORCE++: the KL penalty folded into the token-level return, then
advantages whitened over the global batch). GRPO, Dr. GRPO, RLOO and
REINFORCE++ use theirs; ARPO takes any of them (`algorithm.estimator`):

    algorithm: {name: arpo, estimator: rloo}
    algorithm: {name: arpo, estimator: reinforce_pp, kl_coef: 0.01}

A policy loss turns a micro-batch into the loss and its metrics (`PolicyLoss`):
`clipped` (GRPO's clipped token loss, its mean `loss_agg`), `dr_grpo` (the same,
divided by a constant instead of lengths), `gspo` (a clipped loss per
sequence). An algorithm of GRPO's family names its estimator and its loss
(`agentenv.algorithms.grpo.GRPO`), so a variant is a config class and two names.

An installed package adds estimators and losses through the `agentenv.estimators`
and `agentenv.policy_losses` entry-point groups.

REINFORCE++ follows OpenRLHF (Hu's framework,
`experience_maker.compute_advantages_and_returns`): the outcome reward sits on a
trajectory's last policy token; each policy token t also gets the per-token
penalty -beta * KL_t (k1, log pi_old - log pi_ref); the return (gamma = 1) is
G_t = r - beta * sum_{s >= t} KL_s over policy tokens; advantages are the
returns whitened over every policy token of the global batch, population
variance, 1 / sqrt(max(var, 1e-8)). verl's
`compute_reinforce_plus_plus_outcome_advantage` differs on multi-turn masks: it
restarts the return at every masked token, so a tool result inside the response
changes the first turn's advantage, where here the return runs over the policy
tokens only, across tool results; and by Bessel's correction in the variance.
For the baseline variant, verl also differs in where the KL goes, not only by
Bessel's correction.

Shapes: G trajectories of a group; B trajectories in a micro-batch, T predicted tokens per trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import torch

from agentenv.algorithms.base import LossNorm, Reduce, TrainBatch
from agentenv.errors import ConfigError
from agentenv.registry import Registry
from agentenv.types import Group, Trajectory

LossAgg = Literal["token_mean", "seq_mean_token_mean"]
RolloutCorrection = Literal["none", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]
Aggregation = Callable[[torch.Tensor, torch.Tensor, "LossNorm | None"], torch.Tensor]


# ---------------------------------------------------------------- group advantages, (G,) -> (G,)
def group_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's outcome advantage: A_i = (r_i - mean(r)) / (std(r) + eps).

    Args:
        rewards: (G,) rewards of one group.
        normalize_std: Divide by the group's std (GRPO); off gives Dr. GRPO's
            mean-centred advantage.
    Returns:
        (G,) advantages. A group whose rewards are all equal gets zeros.
    """
    centred = rewards - rewards.mean()  # (G,)
    if not normalize_std or rewards.numel() < 2:
        return centred
    # unbiased std as in GRPO's reference implementations
    return centred / (rewards.std(unbiased=True) + eps)


def mean_centred_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - mean(r): (G,) -> (G,), no std (Liu et al., 2025)."""
    return rewards - rewards.mean()


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


def outcome_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE++: the outcome reward itself, (G,) -> (G,); the baseline is the global mean (whitening)."""
    return rewards.clone()


def group_mean_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline: r_i - mean(r) over the group, (G,) -> (G,)."""
    return rewards - rewards.mean()


# ---------------------------------------------------------------- token-level returns (REINFORCE++)
def kl_returns(
    advantages: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token returns with the KL penalty folded in: G_t = A_t - kl_coef * sum_{s >= t} KL_s. (B, T).

    Args:
        advantages: (B, T) the outcome part on each policy token (the group
            estimator's scalar, broadcast).
        old_logprobs, ref_logprobs: (B, T) under the sampling weights and the reference.
        mask: (B, T) 1 on policy tokens; the KL of other tokens is 0 and the
            result is 0 there.
    """
    mask = mask.to(advantages.dtype)
    kl = (old_logprobs - ref_logprobs) * mask  # (B, T) k1 per token
    tail = kl.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])  # (B, T) sum over s >= t
    return (advantages - kl_coef * tail) * mask


def global_whiten(
    values: torch.Tensor, mask: torch.Tensor, reduce: Reduce, normalize_std: bool = True
) -> tuple[torch.Tensor, float, float]:
    """(values - mean) / std over every masked token of every process; (B, T), 0 where masked.

    `reduce` sums over processes, so the mean and the (population) std are the
    global batch's, not this process's. Returns the whitened values, the mean
    and the std.
    """
    m = mask.to(torch.float64)
    v = values.to(torch.float64)
    s = reduce(torch.stack([(v * m).sum(), m.sum()]))  # (2,) global sum and count
    n = max(float(s[1]), 1.0)
    mean = float(s[0]) / n
    var = float(reduce(((v - mean) ** 2 * m).sum().reshape(1))[0]) / n  # second pass: no cancellation
    std = max(var, 1e-8) ** 0.5
    out = (v - mean) / (std if normalize_std else 1.0) * m
    return out.to(values.dtype), mean, std


def reinforce_pp_step(batch: TrainBatch, reduce: Reduce, cfg: Any) -> dict[str, float]:
    """The batch step: KL folded into the return (when `cfg.kl_coef` > 0), then global whitening
    (`cfg.normalize_std`: divide by the std too). Rewrites `batch.advantages` in place."""
    mask = batch.loss_mask
    metrics: dict[str, float] = {}
    returns = batch.advantages * mask  # (B, T)
    if cfg.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        returns = kl_returns(returns, batch.old_logprobs, batch.ref_logprobs, mask, cfg.kl_coef)
        kl = ((batch.old_logprobs - batch.ref_logprobs) * mask).to(torch.float64)
        s = reduce(torch.stack([kl.sum(), mask.to(torch.float64).sum()]))
        metrics["kl_in_return"] = float(s[0]) / max(float(s[1]), 1.0)
    adv, mean, std = global_whiten(returns, mask, reduce, cfg.normalize_std)
    batch.advantages.copy_(adv)
    metrics.update(return_mean=mean, return_std=std)
    return metrics


# ---------------------------------------------------------------- estimators by name
@dataclass(frozen=True)
class Estimator:
    """A named advantage estimator.

    Attributes:
        scalars: (G,) rewards of a group's valid trajectories -> (G,) advantages;
            it must accept G = 1 (a group with one valid trajectory).
        batch_step: Optional `batch_step(batch, reduce, cfg) -> metrics`, run by the
            algorithm's `finalize` on every process: it rewrites `batch.advantages`
            (per token) using the whole batch (`reduce` sums over processes) and
            `cfg` (the algorithm's config: `kl_coef`, `normalize_std`).
        kl_in_return: The batch step folds the KL penalty into the return, so the
            loss adds no KL term of its own.
    """

    scalars: Callable[[torch.Tensor], torch.Tensor]
    batch_step: Callable[[TrainBatch, Reduce, Any], dict[str, float]] | None = None
    kl_in_return: bool = False


def _check(obj: Any, key: str) -> Estimator:
    if not isinstance(obj, Estimator):
        raise ConfigError(key, f"{obj!r} is not an advantage estimator (agentenv.algorithms.core.Estimator)")
    return obj


_REGISTRY: Registry[Estimator] = Registry(
    "advantage estimator", "algorithm.estimator", group="agentenv.estimators", adapt=_check
)


def register(name: str, estimator: Estimator | str, *, overwrite: bool = False) -> None:
    """Register an Estimator (or a lazy `"module:attr"` string) under `name`."""
    _REGISTRY.register(name, estimator, overwrite=overwrite)


def get_estimator(name: str, key: str = "algorithm.estimator") -> Estimator:
    """The estimator called `name`; an unknown name raises a ConfigError naming `key` and the closest names."""
    return _REGISTRY.get(name, key)


def available() -> list[str]:
    return _REGISTRY.names()


def _group_normalized(rewards: torch.Tensor) -> torch.Tensor:
    return group_advantages(rewards, normalize_std=True)  # (G,)


GRPO_ESTIMATOR = Estimator(scalars=_group_normalized)  # (r - mean) / std, per group
DR_GRPO_ESTIMATOR = Estimator(scalars=mean_centred_advantages)  # r - mean
RLOO_ESTIMATOR = Estimator(scalars=leave_one_out_advantages)  # r_i - mean_{j != i} r_j
# r; KL-in-return, global whitening
REINFORCE_PP_ESTIMATOR = Estimator(scalars=outcome_rewards, batch_step=reinforce_pp_step, kl_in_return=True)
REINFORCE_PP_BASELINE_ESTIMATOR = Estimator(scalars=group_mean_baseline, batch_step=reinforce_pp_step, kl_in_return=True)


register("grpo", GRPO_ESTIMATOR)
register("dr_grpo", DR_GRPO_ESTIMATOR)
register("rloo", RLOO_ESTIMATOR)
register("reinforce_pp", REINFORCE_PP_ESTIMATOR)
register("reinforce_pp_baseline", REINFORCE_PP_BASELINE_ESTIMATOR)


def estimator_for(name: str, cfg: Any) -> Estimator:
    """The estimator called `name`, where `grpo` without the config's `normalize_std` is Dr. GRPO's mean-centred
    `dr_grpo` (a config is asked only for `grpo`: RLOO's has no `normalize_std`)."""
    return get_estimator("dr_grpo" if name == "grpo" and not cfg.normalize_std else name)


def broadcast(traj: Trajectory, value: float) -> torch.Tensor:
    """A trajectory-level advantage on every token: (len(traj),)."""
    return torch.full((len(traj),), float(value), dtype=torch.float32)


def episode_rewards(
    rewards: Sequence[float], valid: Sequence[bool], episodes: Sequence[str | None] | None = None
) -> tuple[list[float], list[int | None]]:
    """A group's rewards by episode: each valid episode's reward once, and each trajectory's episode index.

    An episode counts once in its group however many trajectories it recorded
    (a user's agent may make any number of requests): its weight 1 is split
    evenly over its k valid trajectories, so its reward in the group's
    statistics is their mean (their shared reward; with per-trajectory shaping,
    DAPO's overlong penalty, the mean of the shaped ones). A trajectory whose
    episode is None is an episode of its own; a failed one has index None.
    This is the weight in the group's statistics only: in the loss every token
    of every trajectory counts (an episode's gradient is the sum over all the
    actions it took; docs/guides/own-agent.md).

    Returns:
        (E,) rewards of the valid episodes, in first-seen order, and for each
        trajectory the index of its episode among them (None if failed).
    """
    slot: dict[object, int] = {}
    sums: list[float] = []
    counts: list[int] = []
    index: list[int | None] = []
    for i, (r, ok) in enumerate(zip(rewards, valid)):
        if not ok:
            index.append(None)
            continue
        ep = episodes[i] if episodes is not None else None
        key: object = i if ep is None else ep
        j = slot.setdefault(key, len(sums))
        if j == len(sums):
            sums.append(0.0)
            counts.append(0)
        sums[j] += float(r)
        counts[j] += 1
        index.append(j)
    return [s / c for s, c in zip(sums, counts)], index


def episode_outcomes(trajs: Sequence[Trajectory]) -> tuple[list[float], list[float]]:
    """Each episode's reward and correctness (1.0 or 0.0), once however many trajectories it recorded (their means;
    `episode_rewards`, failed ones included): the logged and evaluated reward and accuracy count episodes, not requests."""
    every, episodes = [True] * len(trajs), [t.episode for t in trajs]
    rewards, _ = episode_rewards([t.reward for t in trajs], every, episodes)
    correct, _ = episode_rewards([float(t.correct) for t in trajs], every, episodes)
    return rewards, correct


def valid_advantages(
    rewards: Sequence[float],
    valid: Sequence[bool],
    scalars: Callable[[torch.Tensor], torch.Tensor],
    episodes: Sequence[str | None] | None = None,
) -> list[float]:
    """One advantage per trajectory from `scalars` over the valid episodes (`episode_rewards`): each trajectory
    gets its episode's; invalid (failed) ones get 0 and do not move the group's statistics."""
    per_episode, index = episode_rewards(rewards, valid, episodes)
    if not per_episode:
        return [0.0] * len(rewards)
    adv = scalars(torch.tensor(per_episode, dtype=torch.float64)).tolist()  # (E,)
    return [0.0 if j is None else adv[j] for j in index]


def group_scalars(group: Group, scalars: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """`valid_advantages` over a group's rewards by episode, failed trajectories left out."""
    trajs = group.trajectories
    return valid_advantages([t.reward for t in trajs], [not t.failed for t in trajs], scalars, [t.episode for t in trajs])


# ---------------------------------------------------------------- the loss
def clipped_pg_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level PPO clipped surrogate with separate low/high clip ranges.

    loss_t = -min(rho_t * A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) * A_t),
    rho_t = exp(new_t - old_t).

    Args:
        new_logprobs, old_logprobs, advantages: (B, T).
    Returns:
        per-token loss (B, T) and a (B, T) bool tensor of where clipping bit.
    """
    ratio = torch.exp(new_logprobs - old_logprobs)  # (B, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)  # (B, T)
    was_clipped = clipped < unclipped  # the min picked the clipped branch
    return per_token, was_clipped


def kl_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref), per token: exp(d) - d - 1, d = ref - new. (B, T).

    With `mask`, d is 0 (and so is the estimate) where the mask is 0, before the
    exponential: masked positions hold no real reference logprob (0), and
    exp(0 - new) overflows to inf once new < -88.7 (float32), making inf * 0 = NaN
    in the loss and its gradient.
    """
    d = ref_logprobs - new_logprobs
    if mask is not None:
        d = torch.where(mask.bool(), d, torch.zeros_like(d))  # (B, T); no gradient flows to masked new
    return torch.exp(d) - d - 1.0


def rollout_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: RolloutCorrection,
    level: CorrectionLevel = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights for tokens sampled by one engine and trained under another.

    rho = pi_old / pi_sampler, the trainer's probability of a sampled token over
    the sampler's (they differ by kernels, precision, or a stale engine): per
    token (`token`), or the product over a trajectory's policy tokens on each of
    its tokens (`sequence`). TIS (truncated IS, Yao et al. 2025) weighs by
    min(rho, C); MIS (masked IS, Liu et al. 2025) by rho where rho <= C and 0
    beyond. As in TRL's `vllm_importance_sampling_mode` and verl's `rollout_is`;
    a zeroed token still counts in the loss's normalizer (an IS estimate
    averages over every sample drawn). Computed in log space: no overflow.

    Args:
        old_logprobs, sampler_logprobs, mask: (B, T).
        mode: `none` (weights 1), `tis` or `mis`.
        level: `token` or `sequence`.
        cap: C > 1.
    Returns:
        (B, T) weights, no gradient (1 where masked), and a (B, T) bool tensor of
        where rho exceeded C (truncated or dropped).
    """
    mask = mask.to(old_logprobs.dtype)
    log_rho = (old_logprobs - sampler_logprobs).detach() * mask  # (B, T); 0 where masked
    if level == "sequence":
        log_rho = log_rho.sum(dim=1, keepdim=True).expand_as(log_rho)  # (B, T): log of the product
    elif level != "token":
        raise ValueError(f"unknown rollout correction level {level!r}; use 'token' or 'sequence'")
    log_cap = math.log(cap)
    over = (log_rho > log_cap) & mask.bool()  # (B, T)
    if mode == "none":
        return torch.ones_like(log_rho), over
    capped = torch.exp(log_rho.clamp(max=log_cap))  # (B, T), at most C
    if mode == "tis":
        return capped, over
    if mode == "mis":
        return torch.where(over, torch.zeros_like(capped), capped), over
    raise ValueError(f"unknown rollout correction {mode!r}; use 'none', 'tis' or 'mis'")


def decoupled_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The behaviour weights of AReaL's decoupled PPO objective (Fu et al., 2025, eq. 5).

    w_t = pi_prox(y_t) / pi_behav(y_t), the recomputed (proximal) probability of a
    sampled token over the probability under the weight version that sampled it;
    with `cap`, tokens whose w_t exceeds it get weight 0 (they stay in the
    loss's normalizer). The clipped ratio itself is pi_theta / pi_prox
    (`clipped_pg_loss` with the recomputed old logprobs).

    Args:
        proximal_logprobs, behaviour_logprobs, mask: (B, T).
        cap: None (no cap) or a cap > 1.
    Returns:
        (B, T) weights, no gradient (0 where masked), and a (B, T) bool tensor of
        where w exceeded the cap.
    """
    log_w = (proximal_logprobs - behaviour_logprobs).detach()  # (B, T)
    m = mask.bool()
    over = (log_w > math.log(cap)) & m if cap is not None else torch.zeros_like(m)
    w = torch.exp(torch.where(m & ~over, log_w, torch.full_like(log_w, -math.inf)))  # 0 where masked or over
    return w, over


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg = "token_mean", norm: LossNorm | None = None
) -> torch.Tensor:
    """Reduce a (B, T) per-token quantity to a scalar over masked tokens.

    - token_mean: sum over masked tokens / number of masked tokens (DAPO).
    - seq_mean_token_mean: sum over sequences of each sequence's token mean /
      number of sequences (the original GRPO); sequences with no masked token
      (failed trajectories) are left out of both.

    The counts are the mini-batch's (`norm`, over every micro-batch and process),
    so the losses of its micro-batches add up to the mini-batch's mean; without
    `norm`, this micro-batch's own.
    """
    norm = norm or LossNorm.of(mask)
    mask = mask.to(per_token.dtype)
    if mode == "token_mean":
        return (per_token * mask).sum() / norm.token_denominator
    if mode == "seq_mean_token_mean":
        tokens = mask.sum(dim=1)  # (B,)
        seq_means = (per_token * mask).sum(dim=1) / tokens.clamp(min=1.0)  # (B,); 0 for a row with no token
        return seq_means.sum() / norm.sequence_denominator
    raise ValueError(f"unknown loss aggregation mode {mode!r}; use 'token_mean' or 'seq_mean_token_mean'")


def constant_normalized_sum(
    per_token: torch.Tensor, mask: torch.Tensor, constant: float, norm: LossNorm | None = None
) -> torch.Tensor:
    """sum over masked tokens of `per_token` (B, T) / (sequences * constant), a scalar.

    No per-sequence length normalization: every token weighs the same whatever
    its trajectory's length. `sequences` are the mini-batch's (`norm`, over every
    micro-batch and process, failed trajectories left out), so micro-batch losses
    add up to the mini-batch's; without `norm`, this micro-batch's own.
    """
    norm = norm or LossNorm.of(mask)
    return (per_token * mask.to(per_token.dtype)).sum() / (norm.sequence_denominator * constant)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def policy_loss(
    batch: TrainBatch,
    new_logprobs: torch.Tensor,
    cfg: Any,
    norm: LossNorm | None = None,
    *,
    kl_coef: float | None = None,
    agg: Aggregation | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's clipped loss on one micro-batch, normalized by `norm` (the mini-batch's counts; None: this
    micro-batch's): the policy losses `clipped` and `dr_grpo`. Metrics are this micro-batch's means.

    Args:
        cfg: The algorithm's config (a `TokenLossConfig`): `clip_low`, `clip_high`,
            `kl_coef`, the rollout correction's fields, and `loss_agg` where `agg` is None.
        kl_coef: The k3 KL term's weight in the loss (None: `cfg.kl_coef`; 0 where
            the KL lives in the return, as REINFORCE++'s).
        agg: `agg(per_token, mask, norm)` -> the scalar loss (None: `aggregate` with
            `cfg.loss_agg`), e.g. Dr. GRPO's constant normalizer.
    """
    kl_coef = cfg.kl_coef if kl_coef is None else kl_coef
    agg = agg or (lambda per_token, mask, n: aggregate(per_token, mask, cfg.loss_agg, n))
    mask = batch.loss_mask  # (B, T)
    per_token, clipped = clipped_pg_loss(new_logprobs, batch.old_logprobs, batch.advantages, cfg.clip_low, cfg.clip_high)
    metrics: dict[str, float] = {}
    if cfg.rollout_correction != "none":
        w, over = rollout_weights(
            batch.old_logprobs, batch.sampler_logprobs, mask,
            cfg.rollout_correction, cfg.rollout_correction_level, cfg.rollout_correction_cap,
        )  # fmt: skip
        per_token = per_token * w  # (B, T); the policy-gradient term only, as TRL and verl
        metrics["is_weight_mean"] = masked_mean(w, mask).item()
        metrics["is_capped_frac"] = masked_mean(over.float(), mask).item()
    if cfg.off_policy == "decoupled":  # old_logprobs: the proximal policy; sampler_logprobs: the behaviour's
        w, over = decoupled_weights(batch.old_logprobs, batch.sampler_logprobs, mask, cfg.behaviour_weight_cap)
        per_token = per_token * w  # (B, T)
        metrics["behaviour_weight_mean"] = masked_mean(w, mask).item()
        metrics["behaviour_capped_frac"] = masked_mean(over.float(), mask).item()
    if kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        kl = kl_k3(new_logprobs, batch.ref_logprobs, mask)  # (B, T)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = masked_mean(kl.detach(), mask).item()
    loss = agg(per_token, mask, norm)
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean(clipped.float(), mask).item()
        metrics["ratio_mean"] = masked_mean(torch.exp(new_logprobs - batch.old_logprobs), mask).item()
        metrics["pg_loss"] = agg(per_token, mask, None).item()  # this micro-batch's mean
    return loss, metrics


# ---------------------------------------------------------------- policy losses by name
class PolicyLoss(Protocol):
    """A policy loss: one micro-batch's loss, divided by `norm` (the mini-batch's counts; None: this
    micro-batch's), and its metrics (this micro-batch's means).

    Args:
        batch: The micro-batch; `new_logprobs` (B, T), with gradients.
        cfg: The algorithm's config; a loss reads its own fields of it (`clipped`:
            a `MeanLossConfig`'s; `dr_grpo`: a `TokenLossConfig`'s and `loss_constant`; `gspo`: the clip range).
        kl_in_return: The estimator folded the KL penalty into the return
            (REINFORCE++): the loss adds no KL term of its own.
    """

    def __call__(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, cfg: Any, norm: LossNorm | None, *, kl_in_return: bool
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def _check_loss(obj: Any, key: str) -> PolicyLoss:
    if not callable(obj):
        raise ConfigError(key, f"{obj!r} is not a policy loss (agentenv.algorithms.core.PolicyLoss)")
    return cast(PolicyLoss, obj)


_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "algorithm.name", group="agentenv.policy_losses", adapt=_check_loss)


def register_loss(name: str, loss: PolicyLoss | str, *, overwrite: bool = False) -> None:
    """Register a policy loss (or a lazy `"module:attr"` string) under `name`."""
    _LOSSES.register(name, loss, overwrite=overwrite)


def get_loss(name: str, key: str = "algorithm.name") -> PolicyLoss:
    """The policy loss called `name`; an unknown name raises a ConfigError naming `key` and the closest names."""
    return _LOSSES.get(name, key)


def clipped_loss(
    batch: TrainBatch, new_logprobs: torch.Tensor, cfg: Any, norm: LossNorm | None, *, kl_in_return: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """`clipped`: GRPO's clipped token loss, its mean `cfg.loss_agg` (GRPO, DAPO, ARPO, GiGPO, RLOO, REINFORCE++)."""
    return policy_loss(batch, new_logprobs, cfg, norm, kl_coef=0.0 if kl_in_return else None)


def constant_normalized_loss(
    batch: TrainBatch, new_logprobs: torch.Tensor, cfg: Any, norm: LossNorm | None, *, kl_in_return: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """`dr_grpo`: the clipped token loss summed over tokens and divided by sequences * `cfg.loss_constant` (Dr. GRPO)."""

    def agg(per_token: torch.Tensor, mask: torch.Tensor, n: LossNorm | None) -> torch.Tensor:
        return constant_normalized_sum(per_token, mask, cfg.loss_constant, n)

    return policy_loss(batch, new_logprobs, cfg, norm, kl_coef=0.0 if kl_in_return else None, agg=agg)


register_loss("clipped", clipped_loss)
register_loss("dr_grpo", constant_normalized_loss)
register_loss("gspo", "agentenv.algorithms.gspo.loss:gspo_policy_loss")
