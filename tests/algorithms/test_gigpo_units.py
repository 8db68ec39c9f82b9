"""GiGPO's pieces on inputs small enough to check by hand: returns, anchor groups, the advantage per token,
failed trajectories, the env's keys, ARPO's trees, the config's checks, AgentEnv's state keys."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.algorithms import get_algorithm
from agentenv.algorithms.core import group_advantages, mean_centred_advantages
from agentenv.algorithms.gigpo import GiGPO, GiGPOConfig, TreeGiGPO, TreeGiGPOConfig, step_metrics
from agentenv.algorithms.gigpo.steps import (
    anchor_group_advantages,
    discounted_returns,
    exact_anchor_ids,
    group_sizes,
    similar_anchor_ids,
)
from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.state import context_keys
from agentenv.envs.testing import CounterTool, EchoTool, boxed_reward
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.types import Group, Segment, Trajectory

EPS = 1e-6  # GRPO's std epsilon


def traj(prompt, turns, reward, **kw):
    """prompt ids, then (policy ids, tool ids) per turn (tool ids empty on the last)."""
    segs = [Segment("prompt", list(prompt))]
    for action, result in turns:
        segs.append(Segment("policy", list(action), [0.0] * len(action), [0.0] * len(action)))
        if result:
            segs.append(Segment("tool", list(result)))
    return Trajectory("t", segs, reward=reward, **kw)


def test_discounted_returns_reward_at_the_end():
    assert discounted_returns(3, 2.0, 0.5).tolist() == [0.5, 1.0, 2.0]  # γ^(T-1-t)·r
    assert discounted_returns(1, 3.0, 0.95).tolist() == [3.0]


def test_anchor_ids_exact_and_similar():
    assert exact_anchor_ids(["a", "b", "a", "c"]) == [0, 1, 0, 2]
    assert group_sizes([0, 1, 0, 2]) == [2, 1, 2, 1]
    ten = list(range(10))
    # ratio 2·9/20 = 0.9 between the first two; the third shares nothing
    assert similar_anchor_ids([ten, ten[:9] + [99], [50, 51]], 0.85) == [0, 0, 1]
    assert similar_anchor_ids([ten, ten[:9] + [99], [50, 51]], 0.95) == [0, 1, 2]


def test_anchor_group_advantages_by_hand():
    returns = torch.tensor([1.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1)
    got = anchor_group_advantages(returns, [0, 0, 0, 1], group_advantages)
    want = [(1 / 3) / (std + EPS), (-2 / 3) / (std + EPS), (1 / 3) / (std + EPS), 0.0]  # a singleton: 0
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-12)
    got = anchor_group_advantages(returns, [0, 0, 0, 1], mean_centred_advantages)
    assert torch.allclose(got, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0], dtype=torch.float64), atol=1e-12)
    equal = anchor_group_advantages(torch.ones(3, dtype=torch.float64), [0, 0, 0], group_advantages)
    assert equal.tolist() == [0.0, 0.0, 0.0]


def two_trajectories():
    # both turns of both trajectories act from shared states: the prompt, then prompt + 5 + result 9
    return Group(task=None, trajectories=[traj([1], [([5], [9]), ([6], [])], 1.0), traj([1], [([5], [9]), ([7], [])], 0.0)])


def test_advantage_per_token_by_hand():
    """mean normalization, γ = 0.95, ω = 1: A^E = ±0.5; returns (0.95, 1) and (0, 0): A^S = ±0.475, ±0.5."""
    algo = GiGPO(GiGPOConfig(normalize_std=False))
    a0, a1 = algo.advantages(two_trajectories())
    # tokens: prompt, turn 1, tool, turn 2 (prompt and tool tokens leave the loss by its mask)
    assert torch.allclose(a0, torch.tensor([0.5, 0.975, 0.5, 1.0]))
    assert torch.allclose(a1, -a0)
    half = GiGPO(GiGPOConfig(normalize_std=False, step_advantage_weight=0.5)).advantages(two_trajectories())[0]
    assert torch.allclose(half, torch.tensor([0.5, 0.7375, 0.5, 0.75]))
    g = two_trajectories()
    GiGPO(GiGPOConfig()).advantages(g)
    assert g.trajectories[0].info["gigpo"]["anchor_sizes"] == [2, 2]
    m = step_metrics(g.trajectories, lambda t: t)
    assert m["gigpo/steps"] == 4 and m["gigpo/anchor_share"] == 1.0
    assert m["gigpo/step_adv_abs_mean"] == pytest.approx(1 / math.sqrt(2), rel=1e-5)  # ±(r - mean)/std = ±0.7071


def test_failed_trajectories_take_no_part():
    g = two_trajectories()
    g.trajectories.append(traj([1], [([5], [9]), ([6], [])], 1.0, failed=True))
    a = GiGPO(GiGPOConfig(normalize_std=False)).advantages(g)
    assert torch.allclose(a[0], torch.tensor([0.5, 0.975, 0.5, 1.0]))  # as without it
    assert a[2].tolist() == [0.0] * 4 and "gigpo" not in g.trajectories[2].info


def test_the_envs_keys_decide_the_groups():
    # different contexts that the env calls one state, and a key count that does not fit
    g = Group(task=None, trajectories=[
        traj([1], [([5], [])], 1.0, state_keys=["S"]), traj([2], [([6], [])], 0.0, state_keys=["S"])])  # fmt: skip
    a = GiGPO(GiGPOConfig(normalize_std=False)).advantages(g)
    assert a[0].tolist() == [0.5, 1.0]  # episode 0.5 + step 0.5: one anchor group although the prompts differ
    bad = Group(task=None, trajectories=[traj([1], [([5], [9]), ([6], [])], 1.0, state_keys=["S"])])
    with pytest.raises(ValueError, match="2 policy turns but 1 state keys"):
        GiGPO(GiGPOConfig()).advantages(bad)


def test_verl_agents_step_weighting_counts_each_step():
    """Rewards 1 (2 steps) and 0 (1 step): over steps the mean is 2/3, so A^E = 1/3 and -2/3, not ±0.5."""
    g = Group(task=None, trajectories=[traj([1], [([5], [9]), ([6], [])], 1.0), traj([1], [([7], [])], 0.0)])
    cfg = GiGPOConfig(normalize_std=False, step_advantage_weight=0.0, episode_weighting="step")
    a = GiGPO(cfg).advantages(g)
    assert a[0][0].item() == pytest.approx(1 / 3) and a[1][0].item() == pytest.approx(-2 / 3)


def test_a_trees_branches_share_the_anchor_of_their_branch_point():
    root = traj([1], [([5], [9]), ([6], [])], 1.0)
    branch = traj([1], [([5], [9]), ([7], [])], 0.0, parent_uid=root.uid, branch_token=3)
    other = traj([1], [([8], [9]), ([6], [])], 0.0)
    g = Group(task=None, trajectories=[root, branch, other])
    assert context_keys(root)[1] == context_keys(branch)[1] != context_keys(other)[1]
    a = TreeGiGPO(TreeGiGPOConfig(group_size=3, initial_rollouts=2, normalize_std=False)).advantages(g)
    # episode (soft): 1 - 1/3; turn 2 of root and branch: returns 1 and 0 in one group, A^S = 0.5
    assert a[0][3].item() == pytest.approx(2 / 3 + 0.5)
    assert a[1][3].item() == pytest.approx(-1 / 3 - 0.5)
    assert a[2][3].item() == pytest.approx(-1 / 3)  # a state of its own: no step advantage
    assert g.trajectories[0].info["gigpo"]["anchor_sizes"] == [3, 2]


@pytest.mark.parametrize(
    ("cls", "fields", "key"),
    [
        (GiGPOConfig, {"gamma": 1.5}, "algorithm.gamma"),
        (GiGPOConfig, {"step_advantage_weight": -1.0}, "algorithm.step_advantage_weight"),
        (GiGPOConfig, {"anchors": "text"}, "algorithm.anchors"),
        (GiGPOConfig, {"similarity_threshold": 1.0}, "algorithm.similarity_threshold"),
        (GiGPOConfig, {"episode_weighting": "token"}, "algorithm.episode_weighting"),
        (TreeGiGPOConfig, {"advantage": "hard_once"}, "algorithm.advantage"),
        (TreeGiGPOConfig, {"estimator": "rloo"}, "algorithm.estimator"),
        (TreeGiGPOConfig, {"episode_weighting": "step"}, "algorithm.episode_weighting"),
    ],
)
def test_bad_settings_name_their_key(cls, fields, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_dataclass(cls, fields, "algorithm")


def test_registered_with_the_papers_defaults():
    cfg = get_algorithm("gigpo")().cfg
    assert (cfg.gamma, cfg.step_advantage_weight, cfg.normalize_std, cfg.group_size) == (0.95, 1.0, True, 8)
    assert get_algorithm("arpo_gigpo")().grows_trees


def test_agent_env_records_the_context_hash_before_each_turn(tok, task, enc):
    env = AgentEnv([EchoTool("search"), CounterTool("python")], tok, reward_fn=boxed_reward)
    env.reset(options={"task": task})
    first = env.state_key()
    env.step(enc("<python>a</python>"))
    child = env.fork()
    assert child.state_key() == env.state_key() != first  # a fork stands where its parent stands
    env.step(enc("<answer>\\boxed{1}</answer>"))
    child.step(enc("<answer>\\boxed{2}</answer>"))
    t, c = env.trajectory(), child.trajectory()
    assert t.state_keys == context_keys(t) and len(t.state_keys) == 2 and t.state_keys[0] == first
    assert c.state_keys == t.state_keys  # the same two states, then different answers
    env.reset(options={"task": task})
    assert env.state_key() == first and env.trajectory().state_keys == []  # a new episode, the same prompt
    env.close()
    child.close()


def test_similarity_anchors_are_not_fooled_by_a_long_prompt():
    """Every trajectory of a group shares its prompt; a long one must not make a later state look like the first.

    With the prompt in the compared context, 400 shared tokens give the initial state and the state after a
    15-token turn a ratio of 2·400/815 > 0.95: one anchor group of steps at different depths.
    """
    prompt = list(range(1000, 1400))
    searched = traj(prompt, [(list(range(5)), list(range(10, 20))), ([7], [])], 1.0)
    answered = traj(prompt, [([8], [])], 0.0)
    g = Group(task=None, trajectories=[searched, answered])
    GiGPO(GiGPOConfig(anchors="similarity", similarity_threshold=0.95)).advantages(g)
    # searched's two steps, answered's one: the initial state is shared, the state after the search is not
    assert searched.info["gigpo"]["anchor_sizes"] == [2, 1]
    assert answered.info["gigpo"]["anchor_sizes"] == [2]
