"""The paper's baselines (DAPO, REINFORCE++, RLOO, GSPO, Dr. GRPO) and the estimator table: advantages and
losses on tensors small enough to check by hand, the same math as TRL / verl / OpenRLHF on identical tensors,
and the config errors."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.algorithms import available, get_algorithm
from agentenv.algorithms.arpo import ARPOConfig, arpo_advantages
from agentenv.algorithms.base import LossNorm, TrainBatch
from agentenv.algorithms.core import (
    constant_normalized_sum,
    get_estimator,
    global_whiten,
    group_scalars,
    kl_returns,
    leave_one_out_advantages,
    mean_centred_advantages,
    reinforce_pp_step,
)
from agentenv.algorithms.dapo import DAPO, DAPOConfig, overlong_penalty
from agentenv.algorithms.grpo import GRPO, GRPOConfig
from agentenv.algorithms.gspo import GSPO, GSPOConfig, gspo_loss
from agentenv.algorithms.presets import DrGRPOConfig, ReinforcePP, ReinforcePPConfig, RLOOConfig
from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.tasks.task import Task
from agentenv.types import Group, Segment, Trajectory

IDENTITY = lambda t: t  # noqa: E731 - a one-process `reduce`

TASK = Task(id="t", messages=({"role": "user", "content": "q"},), ground_truth="a")


def traj(reward: float, failed: bool = False, n: int = 3, finish: str = "answer") -> Trajectory:
    t = Trajectory(task_id="t", segments=[Segment("prompt", [1]), Segment("policy", [2] * n, [0.0] * n, [0.0] * n)])
    t.reward, t.failed, t.finish_reason = reward, failed, finish
    return t


def batch_of(advantages, mask, old=None, ref=None) -> TrainBatch:
    adv = torch.tensor(advantages, dtype=torch.float32)
    B, T = adv.shape
    return TrainBatch(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        loss_mask=torch.tensor(mask, dtype=torch.float32),
        advantages=adv,
        old_logprobs=torch.tensor(old, dtype=torch.float32) if old is not None else torch.zeros(B, T),
        sampler_logprobs=torch.zeros(B, T),
        ref_logprobs=torch.tensor(ref, dtype=torch.float32) if ref is not None else None,
    )


def test_every_baseline_is_registered_with_a_validated_config():
    for name in ("dapo", "reinforce_pp", "reinforce_pp_baseline", "rloo", "gspo", "dr_grpo"):
        assert name in available()
        cls = get_algorithm(name)
        assert cls(cls.config_cls()).group_size() == 8
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(
        __import__("agentenv.algorithms.core", fromlist=["available"]).available()
    )


# ------------------------------------------------------------------ advantages by hand
def test_rloo_leave_one_out_by_hand():
    # r = [1, 0, 0, 1]: r_0's baseline is (0 + 0 + 1) / 3, r_1's is (1 + 0 + 1) / 3
    adv = leave_one_out_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    assert leave_one_out_advantages(torch.tensor([3.0])).tolist() == [0.0]  # no other sample: no baseline


def test_rloo_matches_verl_on_identical_rewards():
    """verl, verl/trainer/ppo/core_algos.py, compute_rloo_outcome_advantage: A_i = r_i * n / (n - 1) - mean * n / (n - 1)."""
    r = torch.tensor([0.3, 1.0, 0.0, 0.7, 0.2])
    n = r.numel()
    verl = r * n / (n - 1) - r.mean() * n / (n - 1)
    assert torch.allclose(leave_one_out_advantages(r), verl)


def test_dr_grpo_advantage_is_mean_centred_by_hand():
    assert mean_centred_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])).tolist() == [0.75, -0.25, -0.25, -0.25]


def test_failed_trajectories_never_move_a_groups_statistics():
    g = Group(task=TASK, trajectories=[traj(1.0), traj(0.0), traj(5.0, failed=True)])
    assert group_scalars(g, get_estimator("rloo").scalars) == [1.0, -1.0, 0.0]  # the failed 5.0 is not a baseline
    assert group_scalars(g, get_estimator("dr_grpo").scalars) == [0.5, -0.5, 0.0]
    assert group_scalars(g, get_estimator("reinforce_pp_baseline").scalars) == [0.5, -0.5, 0.0]
    assert group_scalars(g, get_estimator("reinforce_pp").scalars) == [1.0, 0.0, 0.0]


def test_kl_folded_into_the_return_by_hand():
    # policy tokens 0, 1, 3 (2 is a tool token); k1 KL = old - ref = 0.1, 0.2, (masked), 0.3; beta = 0.5
    # G_3 = 1 - 0.5 * 0.3; G_1 = 1 - 0.5 * (0.2 + 0.3); G_0 = 1 - 0.5 * (0.1 + 0.2 + 0.3)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    old = torch.tensor([[-1.0, -2.0, -4.0, -3.0]])
    ref = torch.tensor([[-1.1, -2.2, -9.0, -3.3]])
    out = kl_returns(torch.ones(1, 4) * mask, old, ref, mask, kl_coef=0.5)
    assert torch.allclose(out, torch.tensor([[0.7, 0.75, 0.0, 0.85]]))


def test_global_whiten_by_hand():
    # masked values 1, 2, 3: mean 2, population variance 2/3
    out, mean, std = global_whiten(torch.tensor([[1.0, 2.0, 3.0, 7.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]]), IDENTITY)
    s = math.sqrt(2 / 3)
    assert mean == pytest.approx(2.0) and std == pytest.approx(s)
    assert torch.allclose(out, torch.tensor([[-1 / s, 0.0, 1 / s, 0.0]]))


def _openrlhf_reinforce(rewards, groups, kl, action_mask, kl_coef, baseline):
    """OpenRLHF, openrlhf/trainer/ppo_utils/experience_maker.py, compute_advantages_and_returns with
    estimator `reinforce` / `reinforce_baseline` (and openrlhf/models/utils.py compute_reward,
    get_cumulative_returns), written here from its formulas: subtract the group mean (baseline), put r
    on the last action token, add -kl_coef * kl on every token, sum the rewards from t to the end
    (gamma 1, non-action tokens 0), normalize by the mean and population variance over action tokens."""
    r = rewards.clone()
    if baseline:
        for ids in groups:
            r[ids] = r[ids] - r[ids].mean()
    B, T = kl.shape
    per_token = -kl_coef * kl
    for i in range(B):
        last = max(t for t in range(T) if action_mask[i, t] > 0)
        per_token[i, last] += r[i]
    per_token = per_token * action_mask
    returns = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            acc = float(per_token[i, t]) + acc
            returns[i, t] = acc
    n = action_mask.sum()
    mean = (returns * action_mask).sum() / n
    var = ((returns - mean) ** 2 * action_mask).sum() / n
    return (returns - mean) * var.clamp(min=1e-8).rsqrt()


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_pp_matches_openrlhf_on_a_multi_turn_batch(baseline):
    """OpenRLHF (Hu's framework) on identical tensors, tool tokens inside the trajectories; see _openrlhf_reinforce."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    groups = [[0, 1, 2], [3, 4]]
    mask = torch.ones(5, 7, dtype=torch.float64)
    mask[:, 2:4] = 0.0  # a tool result in every row
    mask[1, 5:] = 0.0  # shorter rows
    mask[3, 6:] = 0.0
    old = -torch.rand(5, 7, generator=gen, dtype=torch.float64) * mask
    ref = -torch.rand(5, 7, generator=gen, dtype=torch.float64) * mask
    est = get_estimator("reinforce_pp_baseline" if baseline else "reinforce_pp")
    scalars = torch.zeros(5, dtype=torch.float64)
    for ids in groups:
        scalars[ids] = est.scalars(rewards[ids])
    batch = batch_of((scalars[:, None] * mask).tolist(), mask.tolist(), old.tolist(), ref.tolist())
    cfg = ReinforcePPConfig(kl_coef=0.05)
    metrics = reinforce_pp_step(batch, IDENTITY, cfg)
    want = _openrlhf_reinforce(rewards, groups, (old - ref) * mask, mask, 0.05, baseline)
    assert torch.allclose(batch.advantages.double(), want * mask, atol=1e-5)
    assert metrics["kl_in_return"] == pytest.approx(float(((old - ref) * mask).sum() / mask.sum()), rel=1e-5)


def test_reinforce_pp_matches_verl_up_to_bessels_correction():
    """verl, verl/trainer/ppo/core_algos.py, compute_reinforce_plus_plus_outcome_advantage (returns by a
    backward recurrence that resets after the response, then verl/utils/torch_functional.py masked_whiten
    with the unbiased variance), with the k1 KL in the token rewards (core_algos.kl_penalty 'k1').
    On single-turn rows (contiguous response tokens: verl's recurrence also resets at masked tokens
    inside a response, so it would cut a multi-turn return at a tool result) ours is verl's times
    sqrt(n / (n - 1)): we normalize by the population std, as OpenRLHF."""
    gen = torch.Generator().manual_seed(1)
    B, T = 4, 6
    lengths = [6, 4, 5, 2]
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    rewards = torch.tensor([1.0, 0.0, 0.3, 1.0], dtype=torch.float64)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    ref = -torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    beta = 0.1
    token_rewards = -beta * (old - ref) * mask
    for i, n in enumerate(lengths):
        token_rewards[i, n - 1] += rewards[i]
    returns = torch.zeros(B, T, dtype=torch.float64)
    running = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        running = token_rewards[:, t] + running
        returns[:, t] = running
        running = running * mask[:, t]
    n_tok = mask.sum()
    mean = (returns * mask).sum() / n_tok
    var_unbiased = ((returns - mean) ** 2 * mask).sum() / n_tok * n_tok / (n_tok - 1)
    verl = (returns - mean) * torch.rsqrt(var_unbiased + 1e-8) * mask

    batch = batch_of((rewards[:, None] * mask).tolist(), mask.tolist(), old.tolist(), ref.tolist())
    reinforce_pp_step(batch, IDENTITY, ReinforcePPConfig(kl_coef=beta))
    assert torch.allclose(batch.advantages.double(), verl * math.sqrt(n_tok / (n_tok - 1)), atol=1e-5)


def test_reinforce_pp_loss_has_no_kl_term():
    """The KL lives in the return: the loss is GRPO's clipped surrogate without k3, however far the reference."""
    gen = torch.Generator().manual_seed(2)
    mask = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    batch = batch_of([[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]], mask, ref=[[-5.0, -5.0, 0.0], [-5.0, -5.0, -5.0]])
    new = -torch.rand(2, 3, generator=gen)
    loss, metrics = ReinforcePP(ReinforcePPConfig(kl_coef=0.5)).loss(batch, new)
    plain, _ = GRPO(GRPOConfig(kl_coef=0.0)).loss(batch, new)
    assert torch.equal(loss, plain) and "kl" not in metrics


# ------------------------------------------------------------------ losses by hand
def test_dr_grpo_loss_by_hand_and_against_trl():
    """TRL, trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss, loss_type='dr_grpo':
    (per_token_loss * mask).sum() / (batch size * max_completion_length)."""
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert constant_normalized_sum(per_token, mask, 10.0).item() == pytest.approx(7 / 20)  # (1 + 2 + 4) / (2 * 10)
    trl = (per_token * mask).sum() / (per_token.size(0) * 10.0)
    assert constant_normalized_sum(per_token, mask, 10.0).item() == pytest.approx(trl.item())
    # micro-batches divided by the mini-batch's counts add up to the mini-batch's loss
    norm = LossNorm.of(mask)
    halves = sum(constant_normalized_sum(per_token[s], mask[s], 10.0, norm) for s in (slice(0, 1), slice(1, 2)))
    assert halves.item() == pytest.approx(7 / 20)


def test_dr_grpo_algorithm_uses_the_constant():
    batch = batch_of([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    new = torch.zeros(2, 3, requires_grad=True)
    loss, _ = get_algorithm("dr_grpo")(DrGRPOConfig(group_size=2, loss_constant=4.0)).loss(batch, new)
    loss.backward()
    # -rho * A at rho = 1 on 3 tokens, / (2 sequences * 4); each token's gradient -A / 8
    assert loss.item() == pytest.approx(-3 / 8)
    assert new.grad.tolist() == [[-0.125, -0.125, 0.0], [-0.125, 0.0, 0.0]]


def test_gspo_sequence_ratio_clip_and_gradient_by_hand():
    # row 0: log s = mean(0.2, 0.4) = 0.3 -> s = 1.35, clipped to 1 + 4e-4 (A = 1 > 0): no gradient
    # row 1: log s = -1e-4 -> s inside [1 - 3e-4, 1 + 4e-4]; A = -2; loss 2 s; d/dnew_t = 2 s / 2 tokens
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.2, 0.4, 5.0], [-1e-4, -1e-4, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    per_seq, clipped, ratio = gspo_loss(new, old, adv, mask, 3e-4, 4e-4)
    s1 = math.exp(-1e-4)
    assert ratio.tolist() == pytest.approx([math.exp(0.3), s1])
    assert per_seq.tolist() == pytest.approx([-(1 + 4e-4), 2 * s1])
    assert clipped.tolist() == [True, False]
    batch = batch_of(adv.tolist(), mask.tolist(), old.tolist())
    loss, metrics = GSPO(GSPOConfig(group_size=2)).loss(batch, new)
    loss.backward()
    assert loss.item() == pytest.approx((-(1 + 4e-4) + 2 * s1) / 2)
    assert torch.allclose(new.grad, torch.tensor([[0.0, 0.0, 0.0], [s1 / 2, s1 / 2, 0.0]]))
    assert metrics["clip_frac"] == 0.5


def test_gspo_matches_trl_sequence_level_importance_sampling():
    """TRL, trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss with importance_sampling_level='sequence'
    and loss_type='grpo' (TRL's GSPO): log w_i = sum(log_ratio * mask) / mask.sum() per row, coef_1 = exp,
    per-token -min(coef_1 A, clamp(coef_1, 1 - eps_low, 1 + eps_high) A), then each row's token mean, then
    the mean over rows."""
    gen = torch.Generator().manual_seed(3)
    B, T = 4, 5
    mask = (torch.rand(B, T, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    old = -torch.rand(B, T, generator=gen)
    new = old + 1e-3 * torch.randn(B, T, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])[:, None].expand(B, T) * mask
    ours = GSPO(GSPOConfig(group_size=2)).loss(batch_of(adv.tolist(), mask.tolist(), old.tolist()), new)[0]
    log_w = ((new - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    coef_1 = torch.exp(log_w).unsqueeze(-1)
    coef_2 = torch.clamp(coef_1, 1 - 3e-4, 1 + 4e-4)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    trl = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    assert ours.item() == pytest.approx(trl.item(), rel=1e-6)


# ------------------------------------------------------------------ DAPO
def test_soft_overlong_punishment_by_hand_and_against_trl():
    """TRL, trl/rewards/other_rewards.py, get_soft_overlong_punishment (its docstring: 90 tokens with
    max_completion_len 100 and soft_punish_cache 20 give -0.5)."""
    pen = overlong_penalty(torch.tensor([10, 80, 90, 100, 101]), max_tokens=100, cache_tokens=20)
    assert pen.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_dapo_penalty_enters_the_reward_before_the_group_advantage():
    cfg = DAPOConfig(group_size=2, overlong_penalty=True, overlong_max_tokens=10, overlong_cache_tokens=4)
    g = Group(task=TASK, trajectories=[traj(1.0, n=3), traj(1.0, n=8)])  # 8 tokens: (6 - 8) / 4 = -0.5
    dapo = DAPO(cfg)
    assert dapo.shaped_rewards(g) == [1.0, 0.5]
    assert dapo.keep_group(g)  # equal raw rewards, but the penalty makes them differ
    adv = [float(a[0]) for a in dapo.advantages(g)]
    d = 0.25 / math.sqrt(0.125) / (1 + 1e-6 / math.sqrt(0.125))  # (r - mean) / (std + eps), unbiased std of (1, 0.5)
    assert adv == pytest.approx([d, -d], rel=1e-5)
    assert not DAPO(DAPOConfig(group_size=2)).keep_group(g)  # without it the group has equal rewards


def test_dapo_keeps_only_groups_whose_valid_rewards_differ():
    dapo = DAPO(DAPOConfig(group_size=3))
    assert dapo.keep_group(Group(task=TASK, trajectories=[traj(1.0), traj(0.0), traj(1.0)]))
    assert not dapo.keep_group(Group(task=TASK, trajectories=[traj(0.0), traj(0.0), traj(0.0)]))
    # a failed trajectory's reward does not make a group informative
    assert not dapo.keep_group(Group(task=TASK, trajectories=[traj(1.0), traj(1.0), traj(0.0, failed=True)]))
    assert DAPO(DAPOConfig(group_size=3, dynamic_sampling=False)).keep_group(
        Group(task=TASK, trajectories=[traj(0.0), traj(0.0), traj(0.0)])
    )


def test_dapo_overlong_filter_zeroes_the_loss_of_truncated_trajectories():
    trajs = [traj(1.0), traj(0.0, finish="length"), traj(0.0, finish="context"), traj(0.0, finish="tool_limit")]
    batch = batch_of([[1.0, 1.0]] * 4, [[1.0, 1.0]] * 4)
    metrics = DAPO(DAPOConfig(group_size=4)).finalize(batch, trajs, IDENTITY)
    assert batch.loss_mask.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert batch.advantages.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert metrics == {"overlong_filtered": 0.5}
    kept = batch_of([[1.0]] * 4, [[1.0]] * 4)
    assert DAPO(DAPOConfig(group_size=4, overlong_filter=False)).finalize(kept, trajs, IDENTITY) == {}
    assert kept.loss_mask.sum() == 4


# ------------------------------------------------------------------ ARPO with another estimator
def _tree() -> Group:
    parent = traj(1.0, n=4)
    child = traj(0.0, n=4)
    child.parent_uid, child.branch_token = parent.uid, 3  # shares the prompt and 2 policy tokens
    return Group(task=TASK, trajectories=[parent, child, traj(0.0, n=4), traj(1.0, n=4, failed=True)])


def test_arpo_takes_the_rloo_estimator_by_config():
    cfg = config_from_dict({"algorithm": {"name": "arpo", "group_size": 4, "initial_rollouts": 2, "estimator": "rloo"}})
    adv = arpo_advantages(_tree(), cfg.algorithm_config)
    # valid rewards 1, 0, 0: A_0 = 1 - 0 = 1, A_1 = A_2 = 0 - 1/2 (the failed one is no baseline)
    assert [float(a[-1]) for a in adv] == [1.0, -0.5, -0.5, 0.0]
    hard = arpo_advantages(_tree(), ARPOConfig(group_size=4, initial_rollouts=2, estimator="rloo", advantage="hard"))
    assert float(hard[1][0]) == pytest.approx(0.25) and float(hard[1][-1]) == -0.5  # shared tokens: the mean


def test_arpo_with_reinforce_pp_folds_the_kl_and_drops_the_k3_term():
    cfg = ARPOConfig(group_size=4, initial_rollouts=2, estimator="reinforce_pp", kl_coef=0.5)
    arpo = get_algorithm("arpo")(cfg)
    mask = [[1.0, 1.0], [1.0, 1.0]]
    batch = batch_of([[1.0, 1.0], [0.0, 0.0]], mask, old=[[-1.0, -1.0], [-1.0, -1.0]], ref=[[-1.0, -1.0]] * 2)
    metrics = arpo.finalize(batch, [traj(1.0), traj(0.0)], IDENTITY)
    assert torch.allclose(batch.advantages, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))  # whitened: mean 0.5, std 0.5
    assert metrics["kl_in_return"] == 0.0
    new = torch.zeros(2, 2)
    loss, m = arpo.loss(batch, new)
    assert "kl" not in m
    assert arpo_advantages(_tree(), cfg)[0][0].item() == 1.0  # the outcome reward itself before the batch step


# ------------------------------------------------------------------ config errors name the dotted key
@pytest.mark.parametrize(
    "algorithm, key",
    [
        ({"name": "dapo", "clip_low": 0.3, "clip_high": 0.2}, "algorithm.clip_high"),
        ({"name": "dapo", "overlong_max_tokens": 100, "overlong_cache_tokens": 200}, "algorithm.overlong_cache_tokens"),
        ({"name": "dapo", "overlong_cache_tokens": 0}, "algorithm.overlong_cache_tokens"),
        ({"name": "dapo", "max_resample_rounds": -1}, "algorithm.max_resample_rounds"),
        ({"name": "arpo", "estimator": "rlo"}, "algorithm.estimator"),
        ({"name": "rloo", "normalize_std": True}, "algorithm.normalize_std"),
        ({"name": "dr_grpo", "normalize_std": True}, "algorithm.normalize_std"),
        ({"name": "dr_grpo", "loss_constant": 0}, "algorithm.loss_constant"),
        ({"name": "gspo", "kl_coef": 0.1}, "algorithm.kl_coef"),
        ({"name": "gspo", "rollout_correction": "tis"}, "algorithm.rollout_correction"),
        ({"name": "reinforce_pp", "kl_coef": -1.0}, "algorithm.kl_coef"),
    ],
)
def test_bad_configs_name_the_key(algorithm, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict({"algorithm": algorithm})


def test_unknown_estimator_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'rloo'"):
        ARPOConfig(estimator="rlooo")
    assert RLOOConfig().normalize_std is False
