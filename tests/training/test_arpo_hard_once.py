"""ARPO's `advantage: hard_once` through the trainer: finalize drops the branches' copied prefixes."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow


def test_a_train_step_counts_each_shared_token_once(fast_overrides):
    """A toy tree of the tiny model (α = 1, β = 0: every probe after a tool result branches), one step: the
    copies leave the loss."""
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    cfg = config_from_dict({}, fast_overrides + [
        "algorithm.name=arpo", "algorithm.group_size=4", "algorithm.initial_rollouts=1", "algorithm.alpha=1.0",
        "algorithm.beta=0.0", "trainer.seed=1",  # seed 1: its rollouts call search (proven on the shipped model)
        "algorithm.advantage=hard_once",
    ])  # fmt: skip
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train_step(0)
    finally:
        trainer.close()
    dropped = metrics["train/arpo/once_dropped"]
    assert 0.0 < dropped < 1.0  # some tokens were copies, most were not
    assert metrics["train/skipped_updates"] == 0.0
    assert math.isfinite(metrics["train/grad_norm"]) and metrics["train/grad_norm"] > 0
    # what the trees did reaches the step's metrics (every probe branches here: α = 1, β = 0)
    assert metrics["arpo/trees"] == cfg.trainer.tasks_per_step
    assert 0 < metrics["arpo/branches_per_tree"] <= 3 and metrics["arpo/branch_points_per_tree"] > 0
    assert math.isfinite(metrics["arpo/delta_h_at_branch"]) and 0 < metrics["arpo/branch_share_of_tools"] < 1
