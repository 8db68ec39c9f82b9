"""ARPO's advantage variants (soft, hard, hard_once) and fork settings, checked by hand.

The gradients are a tiny causal torch model's, on-policy (old logprobs = new),
through the trainer's own path: `collate`, `ARPO.finalize`, `ARPO.loss`.
"""

from __future__ import annotations

import pytest
import torch

from agentenv.algorithms.arpo import ARPO, ARPOConfig, arpo_advantages
from agentenv.algorithms.arpo.branching import fork_count
from agentenv.algorithms.arpo.tree import counted_once
from agentenv.algorithms.base import LossNorm
from agentenv.algorithms.grpo.algorithm import trajectory_advantages
from agentenv.configs import load_config
from agentenv.envs.testing import make_task
from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.training.batching import collate
from agentenv.types import Group, Segment, Trajectory

V = 16  # vocabulary of the tiny model


def _traj(uid, segs, reward, parent=None, branch=None) -> Trajectory:
    out = []
    for src, ids in segs:
        lp = [0.0] * len(ids) if src == "policy" else None
        out.append(Segment(src, list(ids), lp, lp))
    return Trajectory(task_id="t", segments=out, reward=reward, uid=uid, parent_uid=parent, branch_token=branch)


def hand_tree() -> Group:
    """A (root, reward 1), B (branch of A at token 6, reward 0), C (root, reward 0).

    tokens:   0 1 | 2 3 4 | 5 | 6 7 (8)
    A:        prompt policy tool policy(2)      -> policy tokens 2,3,4 (shared with B), 6,7 (own)
    B:        copies of A's 0..5, policy(3)     -> policy tokens 2,3,4 (copies), 6,7,8 (own)
    C:        prompt(2) policy(4)               -> policy tokens 2..5 (own)
    """
    prompt, shared, tool = [1, 2], [3, 4, 5], [6]
    a = _traj("a", [("prompt", prompt), ("policy", shared), ("tool", tool), ("policy", [7, 8])], 1.0)
    b = _traj("b", [("prompt", prompt), ("policy", shared), ("tool", tool), ("policy", [9, 10, 11])], 0.0, "a", 6)
    c = _traj("c", [("prompt", prompt), ("policy", [12, 13, 14, 15])], 0.0)
    return Group(task=make_task(), trajectories=[a, b, c])


class TinyCausal(torch.nn.Module):
    """logits_t = W (e(x_t) + mean(e(x_0..x_t))): causal, so equal prefixes give equal logprobs."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(V, 8, generator=g))
        self.out = torch.nn.Parameter(torch.randn(8, V, generator=g))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L - 1) logprobs of the next token
        e = self.emb[ids]  # (B, L, 8)
        h = e + e.cumsum(1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        lp = torch.log_softmax(h @ self.out, -1)[:, :-1]  # (B, L - 1, V)
        return lp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def grads(advantage: str) -> tuple[torch.Tensor, object, list[torch.Tensor]]:
    """The flattened gradient of ARPO's on-policy loss on the hand tree, the batch, and the advantages."""
    group = hand_tree()
    algo = ARPO(ARPOConfig(group_size=3, initial_rollouts=2, advantage=advantage, loss_agg="token_mean"))
    advs = algo.advantages(group)
    batch = collate(group.trajectories, advs, pad_id=0)
    model = TinyCausal()
    with torch.no_grad():  # as the trainer: old logprobs, then finalize, then the update
        batch.old_logprobs = model(batch.input_ids) * batch.loss_mask  # (3, 8); on-policy: ratio 1
    algo.finalize(batch, group.trajectories, lambda t: t)
    new = model(batch.input_ids)  # (3, 8)
    loss, _ = algo.loss(batch, new, LossNorm.of(batch.loss_mask))
    loss.backward()
    return torch.cat([model.emb.grad.flatten(), model.out.grad.flatten()]), batch, advs


def test_counts_of_each_token_in_the_loss_by_hand():
    # soft and hard: 5 + 6 + 4 = 15 policy tokens in the loss, the 3 shared ones twice (rows A and B);
    # hard_once: 12, each shared token once (row A), B's copies out
    for adv, total in (("soft", 15), ("hard", 15), ("hard_once", 12)):
        _, batch, _ = grads(adv)
        assert batch.loss_mask.sum() == total, adv
    _, batch, _ = grads("hard_once")
    # column t is token t + 1: A's policy tokens 2,3,4,6,7 -> columns 1,2,3,5,6
    assert batch.loss_mask.tolist() == [
        [0, 1, 1, 1, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1, 1],  # B: 6,7,8 only
        [0, 1, 1, 1, 1, 0, 0, 0],
    ]


def test_advantages_per_token_of_the_three_variants():
    ea, eb, ec = trajectory_advantages(hand_tree(), normalize_std=True)  # GRPO on rewards (1, 0, 0)
    assert eb == ec and ea == pytest.approx(-2 * eb)
    mean = (ea + eb) / 2
    _, soft, _ = grads("soft")
    _, hard, _ = grads("hard")
    _, once, _ = grads("hard_once")
    assert torch.allclose(soft.advantages[0], torch.tensor([0, ea, ea, ea, 0, ea, ea, 0]))
    assert torch.allclose(soft.advantages[1], torch.tensor([0, eb, eb, eb, 0, eb, eb, eb]))
    assert torch.allclose(hard.advantages[0], torch.tensor([0, mean, mean, mean, 0, ea, ea, 0]))
    assert torch.allclose(hard.advantages[1], torch.tensor([0, mean, mean, mean, 0, eb, eb, eb]))
    assert torch.allclose(once.advantages[0], hard.advantages[0])  # A carries the shared tokens
    assert torch.allclose(once.advantages[1], torch.tensor([0, 0, 0, 0, 0, eb, eb, eb]))
    for b in (soft, hard, once):
        assert torch.allclose(b.advantages[2], torch.tensor([0, ec, ec, ec, ec, 0, 0, 0]))


def test_hard_gives_softs_gradient_and_hard_once_does_not():
    g_soft, _, _ = grads("soft")
    g_hard, _, _ = grads("hard")
    g_once, _, _ = grads("hard_once")
    # shared token j: soft adds (ea + eb) g_j / 15 over rows A and B; hard adds 2 (ea + eb)/2 g_j / 15
    assert (g_soft - g_hard).abs().max() < 1e-6
    assert (g_soft - g_once).abs().max() > 1e-2 * g_soft.abs().max()


def test_hard_once_gradient_is_the_hand_written_loss():
    g_once, batch, _ = grads("hard_once")
    ea, eb, ec = trajectory_advantages(hand_tree(), normalize_std=True)
    mean = (ea + eb) / 2
    model = TinyCausal()
    lp = model(batch.input_ids)  # (3, 8)
    # loss = -(1/12) [mean (shared 3 in A) + ea (A's 2) + eb (B's 3) + ec (C's 4)]
    loss = -(mean * lp[0, 1:4].sum() + ea * lp[0, 5:7].sum() + eb * lp[1, 5:8].sum() + ec * lp[2, 1:5].sum()) / 12
    loss.backward()
    expected = torch.cat([model.emb.grad.flatten(), model.out.grad.flatten()])
    assert torch.allclose(g_once, expected, atol=1e-6)


def test_counted_once_on_nested_branches_and_failed_owners():
    # A (10) ; B branches from A at 4 (8) ; D branches from B at 6 (7) ; C branches from A at 4 (9)
    lengths, parents, branch = [10, 8, 9, 7], [None, 0, 0, 1], [None, 4, 4, 6]
    a, b, c, d = counted_once(lengths, parents, branch)
    assert a.tolist() == [True] * 10  # A owns 0..3 and carries them
    assert b.tolist() == [False] * 4 + [True] * 4  # B owns 4..7; 4..5 shared with D, B carries them
    assert c.tolist() == [False] * 4 + [True] * 5
    assert d.tolist() == [False] * 6 + [True]
    # A failed: its tokens 0..3 are carried by the first valid sharer, B (row order); C and D drop them
    a, b, c, d = counted_once(lengths, parents, branch, valid=[False, True, True, True])
    assert b.tolist() == [True] * 8 and c.tolist() == [False] * 4 + [True] * 5 and d.tolist() == [False] * 6 + [True]
    # A and B failed: D carries A's 0..3 and B's 4..5 (C comes before D in row order: C carries 0..3)
    a, b, c, d = counted_once(lengths, parents, branch, valid=[False, False, True, True])
    assert c.tolist() == [True] * 9 and d.tolist() == [False] * 4 + [True] * 3
    # every valid token of the tree counted exactly once: per (owner, position) one carrier
    for valid in ([True] * 4, [False, True, True, True], [False, False, True, True], [True, False, True, False]):
        keep = counted_once(lengths, parents, branch, valid=valid)
        kept = sum(int(k.sum()) for k, v in zip(keep, valid) if v)
        distinct = {(o, j) for i, v in enumerate(valid) if v for j, o in enumerate(_owner_row(i, parents, branch, lengths))}
        assert kept == len(distinct), valid


def _owner_row(i, parents, branch, lengths):
    row = [i] * lengths[i]
    p, b = parents[i], branch[i]
    if p is not None:
        row[:b] = _owner_row(p, parents, branch, lengths)[:b]
    return row


def test_hard_once_without_branches_changes_nothing():
    group = hand_tree()
    group.trajectories[1].parent_uid = None  # B as an independent root
    group.trajectories[1].branch_token = None
    algo = ARPO(ARPOConfig(group_size=3, initial_rollouts=2, advantage="hard_once"))
    batch = collate(group.trajectories, algo.advantages(group), pad_id=0)
    before = batch.loss_mask.clone()
    assert algo.finalize(batch, group.trajectories, lambda t: t) == {"arpo/once_dropped": 0.0}
    assert torch.equal(batch.loss_mask, before)
    assert ARPO(ARPOConfig(group_size=3, initial_rollouts=2)).finalize(batch, group.trajectories, lambda t: t) == {}


def test_hard_once_advantages_equal_hard():
    g = hand_tree()
    hard = arpo_advantages(g, ARPOConfig(group_size=3, initial_rollouts=2, advantage="hard"))
    once = arpo_advantages(g, ARPOConfig(group_size=3, initial_rollouts=2, advantage="hard_once"))
    assert all(torch.equal(h, o) for h, o in zip(hard, once))


# --------------------------------------------------------------------------- forks per branch point


def test_fork_count_paper_and_code_readings_by_hand():
    def above(u):  # the stochastic rule with P = 0.6: branch when u <= 0.6
        return u <= 0.6

    # the paper: one decision, then Z forks or none
    assert fork_count(2, "per_point", [0.3], above) == 2
    assert fork_count(2, "per_point", [0.9], above) == 0
    # the published code with beam_size 3: Z = 2 forks, each its own coin
    assert fork_count(2, "per_fork", [0.3, 0.9], above) == 1
    assert fork_count(2, "per_fork", [0.3, 0.5], above) == 2
    assert fork_count(2, "per_fork", [0.7, 0.9], above) == 0
    # the published code's beam_size 2: one fork, one coin
    assert fork_count(1, "per_fork", [0.5], above) == 1
    with pytest.raises(ValueError, match="needs 2 draws"):
        fork_count(2, "per_fork", [0.3], above)


def test_old_beam_size_key_is_refused_with_what_it_became():
    with pytest.raises(ConfigError) as e:
        build_dataclass(ARPOConfig, {"beam_size": 2}, "algorithm")
    msg = str(e.value)
    assert e.value.key == "algorithm.beam_size"
    assert "forks_per_branch: B" in msg and "forks_per_branch: B - 1 with fork_decision: per_fork" in msg
    with pytest.raises(ConfigError, match="was renamed"):
        load_config("configs/toy_arpo.yaml", ["algorithm.beam_size=2"])


def test_fork_settings_validate_and_n_equal_m_is_allowed():
    cfg = ARPOConfig(group_size=8, initial_rollouts=8)
    assert cfg.branch_budget == 0
    assert (ARPOConfig().forks_per_branch, ARPOConfig().fork_decision) == (2, "per_point")
    with pytest.raises(ConfigError, match="must be one of 'per_point', 'per_fork', got 'per_beam'") as e:
        build_dataclass(ARPOConfig, {"fork_decision": "per_beam"}, "algorithm")  # a Literal: the loader checks it
    assert e.value.key == "algorithm.fork_decision"
    with pytest.raises(ConfigError, match="N 5 must be <= group_size M 4") as e:
        ARPOConfig(group_size=4, initial_rollouts=5)
    assert e.value.key == "algorithm.initial_rollouts"


def test_hard_once_with_a_kl_in_the_return_is_refused():
    # counted once, a shared token's return would hold only its carrier's KL tail
    with pytest.raises(ConfigError, match="carrier's KL tail") as e:
        ARPOConfig(advantage="hard_once", estimator="reinforce_pp", kl_coef=0.01)
    assert e.value.key == "algorithm.advantage"
    assert ARPOConfig(advantage="hard_once", estimator="reinforce_pp", kl_coef=0.0).kl_coef == 0.0
    assert ARPOConfig(advantage="hard", estimator="reinforce_pp", kl_coef=0.01).advantage == "hard"
    assert ARPOConfig(advantage="hard_once", estimator="rloo", kl_coef=0.01).estimator == "rloo"  # KL in the loss
