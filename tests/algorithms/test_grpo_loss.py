"""GRPO's pure functions on tensors small enough to check by hand."""

import math

import pytest
import torch

from agentenv.algorithms import available, get_algorithm
from agentenv.algorithms.base import TrainBatch
from agentenv.algorithms.core import aggregate, clipped_pg_loss, group_advantages, kl_k3
from agentenv.algorithms.grpo import GRPO, GRPOConfig, trajectory_advantages
from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.tasks import Task
from agentenv.types import Group, Segment, Trajectory


def test_group_advantages_std_normalized_by_hand():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866
    assert torch.allclose(adv, torch.tensor([0.8660, -0.8660, -0.8660, 0.8660]), atol=1e-4)


def test_group_advantages_dr_grpo_is_mean_centred():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), normalize_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_rewards_give_zero_advantage():
    assert torch.count_nonzero(group_advantages(torch.tensor([0.3, 0.3, 0.3]))) == 0


def test_clipped_pg_loss_four_quadrants():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, clipped = clipped_pg_loss(new, old, adv, clip_low=0.2, clip_high=0.2)
    # rho=1.5,A=+1 -> clipped to 1.2; rho=1.5,A=-1 -> -1.5 kept (pessimistic);
    # rho=0.5,A=+1 -> 0.5 kept; rho=0.5,A=-1 -> clipped to 0.8
    assert torch.allclose(loss, torch.tensor([[-1.2, 1.5, -0.5, 0.8]]), atol=1e-6)
    assert clipped.tolist() == [[True, False, False, True]]


def test_clip_high_is_separate_from_clip_low():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.25, 0.75]]))
    adv = torch.tensor([[1.0, -1.0]])
    loss, clipped = clipped_pg_loss(new, old, adv, clip_low=0.2, clip_high=0.28)
    # 1.25 < 1.28: not clipped; 0.75 < 0.8 with A<0: clipped to 0.8
    assert torch.allclose(loss, torch.tensor([[-1.25, 0.8]]), atol=1e-6)
    assert clipped.tolist() == [[False, True]]


def test_kl_k3_by_hand():
    assert kl_k3(torch.zeros(2), torch.zeros(2)).abs().max() == 0
    v = kl_k3(torch.tensor([0.0]), torch.tensor([math.log(2.0)]))
    assert v.item() == pytest.approx(2.0 - math.log(2.0) - 1.0, abs=1e-6)


def test_aggregate_modes_by_hand():
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(per, mask, "token_mean").item() == pytest.approx(2.5)
    assert aggregate(per, mask, "seq_mean_token_mean").item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(per, mask, "sum")  # type: ignore[arg-type]


def test_masked_tokens_get_no_gradient():
    new = torch.zeros(1, 3, requires_grad=True)
    batch = TrainBatch(
        input_ids=torch.zeros(1, 4, dtype=torch.long),
        attention_mask=torch.ones(1, 4, dtype=torch.long),
        loss_mask=torch.tensor([[1.0, 0.0, 1.0]]),
        advantages=torch.tensor([[1.0, 5.0, -1.0]]),
        old_logprobs=torch.zeros(1, 3),
        sampler_logprobs=torch.zeros(1, 3),
    )
    loss, metrics = GRPO(GRPOConfig(group_size=2)).loss(batch, new)
    loss.backward()
    # d/dnew of -rho*A at rho=1 is -A, averaged over 2 masked tokens
    assert new.grad.tolist() == [[-0.5, 0.0, 0.5]]
    assert metrics["clip_frac"] == 0.0


def _traj(reward, failed=False, n=3):
    t = Trajectory(task_id="t", segments=[Segment("prompt", [1]), Segment("policy", [2] * n, [0.0] * n, [0.0] * n)])
    t.reward, t.failed = reward, failed
    return t


def test_failed_trajectories_leave_group_statistics_alone():
    task = Task(id="t", messages=({"role": "user", "content": "q"},), ground_truth="a")
    g = Group(task=task, trajectories=[_traj(1.0), _traj(0.0), _traj(5.0, failed=True)])
    adv = trajectory_advantages(g, normalize_std=False)
    assert adv == [0.5, -0.5, 0.0]
    per_token = GRPO(GRPOConfig(group_size=3, normalize_std=False)).advantages(g)
    assert per_token[0].shape == (4,) and float(per_token[0][0]) == 0.5


def test_registry_selects_and_suggests():
    assert "grpo" in available() and "arpo" in available()
    assert get_algorithm("grpo") is GRPO
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        get_algorithm("grpp")


def test_config_errors_carry_numbers():
    with pytest.raises(ConfigError, match="algorithm.group_size.*got 1"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="algorithm.loss_agg: must be one of 'token_mean', 'seq_mean_token_mean', got 'sum'"):
        config_from_dict({"algorithm": {"name": "grpo", "loss_agg": "sum"}})  # a Literal: the loader checks it


def test_trimmed_batch_drops_only_shared_padding_and_keeps_the_loss():
    # rows of 3 and 2 real tokens, padded to 5 (a longer trajectory elsewhere in the step)
    batch = TrainBatch(
        input_ids=torch.tensor([[5, 6, 7, 0, 0], [5, 8, 0, 0, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]),
        loss_mask=torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]),
        advantages=torch.tensor([[1.0, -2.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]]),
        old_logprobs=torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0]]),
        sampler_logprobs=torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0]]),
    )
    cut = batch.trimmed()
    assert cut.input_ids.tolist() == [[5, 6, 7], [5, 8, 0]]
    assert cut.loss_mask.shape == cut.advantages.shape == cut.old_logprobs.shape == (2, 2)
    assert cut.trimmed() is cut  # nothing left to trim
    new = torch.tensor([[-0.9, -2.2, 0.0, 0.0], [-0.4, 0.0, 0.0, 0.0]])
    for agg in ("token_mean", "seq_mean_token_mean"):
        algo = GRPO(GRPOConfig(group_size=2, loss_agg=agg))
        full, _ = algo.loss(batch, new)
        short, _ = algo.loss(cut, new[:, :2])
        assert short.item() == pytest.approx(full.item(), abs=1e-7), agg
