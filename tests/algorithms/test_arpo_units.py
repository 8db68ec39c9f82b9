"""ARPO's pure parts on inputs small enough to check by hand: config, branching rule, hard advantage."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentenv.algorithms import get_algorithm
from agentenv.algorithms.arpo import (
    ARPO,
    ARPOConfig,
    arpo_advantages,
    entropy_scale,
    shared_token_mean,
    should_branch,
    window_entropy,
)
from agentenv.algorithms.arpo.sampler import _cut_at_spanning_stop
from agentenv.algorithms.base import Algorithm, Sampler, TrainBatch, generated_tokens, group_generated_tokens
from agentenv.algorithms.core import policy_loss
from agentenv.algorithms.grpo import GRPO, GRPOConfig
from agentenv.envs.testing import build_test_tokenizer, make_task
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.types import Generation, Group, Segment, Trajectory

# --------------------------------------------------------------------------- config


def test_defaults_are_the_papers():
    c = ARPOConfig()
    assert (c.group_size, c.initial_rollouts, c.forks_per_branch) == (16, 8, 2)
    assert (c.alpha, c.beta, c.tau, c.entropy_window) == (0.5, 0.2, 0.5, 20)
    assert (c.branch_rule, c.advantage, c.kl_coef, c.fork_decision) == ("threshold", "soft", 0.0, "per_point")
    assert c.branch_budget == 8
    assert isinstance(c, GRPOConfig)  # the loss fields are GRPO's


@pytest.mark.parametrize(
    "kwargs, key, numbers",
    [
        ({"group_size": 8, "initial_rollouts": 12}, "algorithm.initial_rollouts", ["M 8", "N 12"]),
        ({"initial_rollouts": 0}, "algorithm.initial_rollouts", ["0"]),
        ({"forks_per_branch": 0}, "algorithm.forks_per_branch", ["0"]),
        ({"entropy_window": 0}, "algorithm.entropy_window", ["0"]),
        ({"tau": 1.5}, "algorithm.tau", ["1.5"]),
        ({"alpha": -0.1}, "algorithm.alpha", ["-0.1"]),
        ({"beta": -0.2}, "algorithm.beta", ["-0.2"]),
        ({"branch_rule": "coin"}, "algorithm.branch_rule", ["'coin'"]),
        ({"advantage": "medium"}, "algorithm.advantage", ["'medium'"]),
        ({"entropy_norm": "vocab"}, "algorithm.entropy_norm", ["'vocab'"]),
        ({"clip_low": 0.0}, "algorithm.clip_low", ["0.0"]),  # GRPO's validation, inherited
    ],
)
def test_invalid_config_names_key_and_numbers(kwargs, key, numbers):
    with pytest.raises(ConfigError) as e:
        build_dataclass(ARPOConfig, kwargs, "algorithm")  # as a run builds it: the loader checks the Literal choices
    assert e.value.key == key
    for n in numbers:
        assert n in str(e.value)


def test_config_from_the_algorithm_section():
    cfg = build_dataclass(get_algorithm("arpo").config_cls, {"forks_per_branch": 3, "advantage": "hard"}, "algorithm")
    assert cfg.forks_per_branch == 3 and cfg.advantage == "hard"
    with pytest.raises(ConfigError, match="beam_siz"):
        build_dataclass(ARPOConfig, {"beam_siz": 3}, "algorithm")


def test_the_plugin_fits_the_protocols():
    algo = get_algorithm("arpo")(ARPOConfig(group_size=6, initial_rollouts=2))
    assert algo.__class__ is ARPO
    assert isinstance(algo, Algorithm) and isinstance(algo.sampler(), Sampler)
    assert algo.group_size() == 6


# --------------------------------------------------------------------------- branching rule


def test_window_entropy_is_a_per_token_mean_of_the_first_k():
    assert window_entropy([1.0, 2.0, 3.0, 100.0], 3) == pytest.approx(2.0)
    assert window_entropy([1.0, 2.0], 20) == pytest.approx(1.5)  # fewer than k tokens: all of them
    with pytest.raises(ValueError):
        window_entropy([], 20)


def test_entropy_scale():
    assert entropy_scale("none", 151_000) == 1.0
    assert entropy_scale("log_vocab", 1000) == pytest.approx(math.log(1000))


RULE = dict(alpha=0.5, beta=0.2, tau=0.5)


@pytest.mark.parametrize(
    "h_t, h_initial, expected",
    [
        (1.5, 1.0, True),  # P = 0.5 + 0.2 * 0.5 = 0.6 > 0.5
        (1.0, 1.0, False),  # P = 0.5, not > 0.5
        (0.5, 1.0, False),  # P = 0.4
        (1.001, 1.0, True),
    ],
)
def test_threshold_rule_is_exact(h_t, h_initial, expected):
    # u is ignored by the threshold rule
    for u in (0.0, 0.5, 0.999):
        assert should_branch(h_t, h_initial, **RULE, rule="threshold", u=u) is expected


def test_threshold_rule_with_alpha_below_tau_needs_a_large_rise():
    rule = dict(alpha=0.4, beta=0.2, tau=0.5)  # needs β·ΔH > 0.1, i.e. ΔH > 0.5
    assert not should_branch(1.4, 1.0, **rule, rule="threshold", u=0.0)
    assert should_branch(1.6, 1.0, **rule, rule="threshold", u=0.0)


def test_threshold_rule_divides_delta_h_by_the_scale():
    rule = dict(alpha=0.4, beta=0.2, tau=0.5)
    assert should_branch(2.0, 1.0, **rule, rule="threshold", u=0.0, scale=1.0)  # ΔH 1.0
    assert not should_branch(2.0, 1.0, **rule, rule="threshold", u=0.0, scale=4.0)  # ΔH 0.25


@pytest.mark.parametrize(
    "h_t, h_initial, p",
    [
        (2.0, 1.0, 0.7),  # clip(0.5 + 0.2 * 1.0) = 0.7
        (0.0, 1.0, 0.3),
        (1.0, 1.0, 0.5),
        (6.0, 1.0, 1.0),  # 0.5 + 1.0 -> clipped to 1
        (-5.0, 1.0, 0.0),  # 0.5 - 1.2 -> clipped to 0
    ],
)
def test_stochastic_rule_branches_with_probability_clip_tau_plus_beta_delta(h_t, h_initial, p):
    rng = random.Random(1234)
    n = 20_000
    hits = sum(should_branch(h_t, h_initial, **RULE, rule="stochastic", u=rng.random()) for _ in range(n))
    # binomial std at p=0.5: 0.0035; 0.015 is > 4 sigma
    assert hits / n == pytest.approx(p, abs=0.015)


def test_unknown_rule_raises():
    with pytest.raises(ValueError, match="unknown branch rule"):
        should_branch(1.0, 1.0, **RULE, rule="coin", u=0.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- hard advantage

#   A (10 tokens, value 1.0)
#   ├── B branches at 4 (8 tokens, -1.0)
#   │     └── D branches at 6 (7 tokens, 2.0)
#   └── C branches at 4 (9 tokens, 0.5)
VALUES = [1.0, -1.0, 0.5, 2.0]
LENGTHS = [10, 8, 9, 7]
PARENTS = [None, 0, 0, 1]
BRANCH = [None, 4, 4, 6]


def test_hard_advantage_on_a_hand_built_tree():
    a, b, c, d = shared_token_mean(VALUES, LENGTHS, PARENTS, BRANCH)
    shared4 = (1.0 - 1.0 + 0.5 + 2.0) / 4  # tokens 0..3: A, B, C and D share them
    bd = (-1.0 + 2.0) / 2  # tokens 4..5 of B: B and D
    assert torch.allclose(a, torch.tensor([shared4] * 4 + [1.0] * 6))
    assert torch.allclose(b, torch.tensor([shared4] * 4 + [bd] * 2 + [-1.0] * 2))
    assert torch.allclose(c, torch.tensor([shared4] * 4 + [0.5] * 5))
    assert torch.allclose(d, torch.tensor([shared4] * 4 + [bd] * 2 + [2.0] * 1))


def test_hard_advantage_leaves_failed_trajectories_out_of_the_means():
    a, b, c, d = shared_token_mean(VALUES, LENGTHS, PARENTS, BRANCH, valid=[True, True, True, False])
    shared3 = (1.0 - 1.0 + 0.5) / 3
    assert torch.allclose(a[:4], torch.full((4,), shared3))
    assert torch.allclose(b[4:6], torch.full((2,), -1.0))  # D no longer shares them
    assert torch.allclose(d, torch.full((7,), 2.0))  # its own value; masked from the loss anyway


def test_hard_advantage_without_branches_is_grpo():
    out = shared_token_mean([0.3, -0.3], [5, 6], [None, None], [None, None])
    assert torch.allclose(out[0], torch.full((5,), 0.3)) and torch.allclose(out[1], torch.full((6,), -0.3))


def test_hard_advantage_rejects_broken_trees():
    with pytest.raises(ValueError, match="branches at token 12"):
        shared_token_mean([0.0, 0.0], [10, 8], [None, 0], [None, 12])
    with pytest.raises(ValueError, match="cycle"):
        shared_token_mean([0.0, 0.0], [4, 4], [1, 0], [2, 2])


def _traj(uid: str, tokens: list[tuple[str, int]], reward: float, parent: str | None = None, branch: int | None = None):
    segs = [
        Segment(src, list(range(n)), [0.0] * n if src == "policy" else None, [0.0] * n if src == "policy" else None)
        for src, n in tokens
    ]
    return Trajectory(task_id="t", segments=segs, reward=reward, uid=uid, parent_uid=parent, branch_token=branch)


def hand_group() -> Group:
    # prompt 3, policy 4, tool 2 -> branch point 9; the branch writes 5 policy tokens of its own
    a = _traj("a", [("prompt", 3), ("policy", 4), ("tool", 2), ("policy", 6)], reward=1.0)
    b = _traj("b", [("prompt", 3), ("policy", 4), ("tool", 2), ("policy", 5)], reward=0.0, parent="a", branch=9)
    c = _traj("c", [("prompt", 3), ("policy", 7)], reward=0.0)
    return Group(task=make_task(), trajectories=[a, b, c])


def test_arpo_soft_advantage_is_grpos():
    g = hand_group()
    soft = arpo_advantages(g, ARPOConfig(group_size=3, initial_rollouts=1))
    grpo = GRPO(GRPOConfig(group_size=3)).advantages(g)
    for s, r in zip(soft, grpo):
        assert torch.equal(s, r)


def test_arpo_hard_advantage_from_uids_and_branch_tokens():
    g = hand_group()
    cfg = ARPOConfig(group_size=3, initial_rollouts=1, advantage="hard")
    a, b, c = arpo_advantages(g, cfg)
    # GRPO on rewards (1, 0, 0): mean 1/3, std sqrt(1/3) -> (1.1547, -0.5774, -0.5774)
    ea, eb = 2 / 3 / math.sqrt(1 / 3), -1 / 3 / math.sqrt(1 / 3)
    shared = (ea + eb) / 2
    assert torch.allclose(a, torch.tensor([shared] * 9 + [ea] * 6), atol=1e-4)
    assert torch.allclose(b, torch.tensor([shared] * 9 + [eb] * 5), atol=1e-4)
    assert torch.allclose(c, torch.full((10,), eb), atol=1e-4)


def test_generated_tokens_count_shared_prefixes_once():
    g = hand_group()
    assert [generated_tokens(t) for t in g] == [10, 5, 7]
    assert group_generated_tokens(g) == 22
    assert sum(t.num_policy_tokens for t in g) == 26  # b's 4 copied prefix tokens counted again
    # the trainer asks the algorithm (its interface), not the tree module
    assert ARPO().generated_tokens(g) == GRPO().generated_tokens(g) == 22


def test_arpo_loss_is_grpos_loss():
    torch.manual_seed(0)
    B, T = 3, 5
    batch = TrainBatch(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        loss_mask=torch.ones(B, T),
        advantages=torch.randn(B, T),
        old_logprobs=torch.randn(B, T),
        sampler_logprobs=torch.randn(B, T),
    )
    new = torch.randn(B, T)
    cfg = ARPOConfig(clip_high=0.28)
    loss, metrics = ARPO(cfg).loss(batch, new)
    ref, ref_metrics = policy_loss(batch, new, cfg)
    assert torch.equal(loss, ref) and metrics == ref_metrics


# --------------------------------------------------------------------------- continuing a split turn


def test_a_stop_string_split_by_the_probe_boundary_ends_the_turn():
    tok = build_test_tokenizer()
    turn = list(tok.encode("<python>print(1)</python>", add_special_tokens=False))
    after = list(tok.encode(" and more text", add_special_tokens=False))
    ids = turn + after
    # the probe ended inside "</python>": find a boundary in the middle of the closing tag
    boundary = next(i for i in range(len(turn)) if "</" in tok.decode(turn[:i]) and not tok.decode(turn[:i]).endswith("</python>"))
    gen = Generation(ids, [0.0] * len(ids), [0.1] * len(ids), "length")
    cut = _cut_at_spanning_stop(gen, boundary, ("</python>", "</answer>"), tok)
    assert cut.token_ids == turn
    assert cut.finish_reason == "stop" and cut.stop_string == "</python>"
    # nothing to cut when no stop string spans the boundary
    plain = Generation(after, [0.0] * len(after), [0.0] * len(after), "length")
    assert _cut_at_spanning_stop(plain, 2, ("</python>",), tok) is plain
