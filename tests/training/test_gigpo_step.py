"""GiGPO through the trainer on the tiny model: one step, anchor groups found in real rollouts, the weights move."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "algorithm",
    [
        ["algorithm.name=gigpo", "algorithm.group_size=4", "trainer.seed=1"],
        # α = 1, β = 0: every probe after a tool result branches, so a branch point's paths share a state
        ["algorithm.name=arpo_gigpo", "algorithm.group_size=4", "algorithm.initial_rollouts=1", "algorithm.alpha=1.0",
         "algorithm.beta=0.0", "trainer.seed=1"],
    ],
    ids=["gigpo", "arpo_gigpo"],
)
def test_one_step_finds_anchor_groups_and_moves_the_weights(fast_overrides, algorithm):
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    trainer = Trainer(config_from_dict({}, fast_overrides + algorithm))
    before = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    try:
        m = trainer.train_step(0)
        after = trainer.unwrapped().state_dict()
    finally:
        trainer.close()
    assert m["rollout/failed"] == 0
    steps, share = m["train/gigpo/steps"], m["train/gigpo/anchor_share"]
    # every trajectory's first turn acts from its task's prompt: 2 tasks x 4 first turns share a state at least
    assert steps >= 8 and 8 / steps <= share <= 1.0, m
    assert m["train/gigpo/step_adv_std"] >= 0 and math.isfinite(m["train/gigpo/step_adv_abs_mean"])
    assert m["train/skipped_updates"] == 0.0 and math.isfinite(m["train/grad_norm"])
    if m["train/grad_norm"] > 0:  # some advantage was non-zero: the update moved the weights
        assert any(not torch.equal(before[k], after[k]) for k in before)
    else:  # every reward and return equal: nothing to learn, nothing moved
        assert m["train/gigpo/step_adv_abs_mean"] == 0.0
