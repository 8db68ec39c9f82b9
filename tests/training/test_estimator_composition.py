"""ARPO's tree with another advantage estimator is a config, not new code: a real training step of
`{name: arpo, estimator: rloo}` and of `{name: arpo, estimator: reinforce_pp, kl_coef: 0.01}` on the tiny
model (tree sampler, hf backend, toy search tasks)."""

from __future__ import annotations

import math

import pytest

from agentenv.algorithms.arpo import ARPO
from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer

pytestmark = pytest.mark.slow

ARPO_SMALL = ["algorithm.name=arpo", "algorithm.group_size=4", "algorithm.initial_rollouts=2", "policy.temperature=1.0"]


def _step(overrides: list[str]) -> tuple[Trainer, dict[str, float]]:
    trainer = Trainer(config_from_dict({}, overrides))
    try:
        return trainer, trainer.train_step(0)
    finally:
        trainer.close()


def test_arpo_tree_with_the_rloo_estimator_trains(fast_overrides):
    trainer, m = _step(fast_overrides + ARPO_SMALL + ["algorithm.estimator=rloo"])
    assert isinstance(trainer.algorithm, ARPO) and trainer.algorithm.cfg.estimator == "rloo"
    assert trainer.ref_model is None  # no KL: no reference model
    assert m["rollout/trajectories"] == 8.0 and m["rollout/failed"] == 0.0
    assert math.isfinite(m["train/pg_loss"]) and "train/return_std" not in m  # no batch step for RLOO


def test_arpo_tree_with_reinforce_pp_folds_the_kl_into_the_return(fast_overrides):
    trainer, m = _step(fast_overrides + ARPO_SMALL + ["algorithm.estimator=reinforce_pp", "algorithm.kl_coef=0.01"])
    assert trainer.ref_model is not None  # kl_coef > 0 loads the reference for the KL in the return
    # before any update the policy is the reference: the KL in the return is 0 (up to float noise)
    assert abs(m["train/kl_in_return"]) < 1e-4
    assert math.isfinite(m["train/return_std"]) and math.isfinite(m["train/pg_loss"])  # the batch step ran
    assert "train/kl" not in m  # no k3 term in the loss
