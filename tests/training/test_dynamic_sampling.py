"""DAPO's dynamic sampling on the real trainer (tiny model's weights, hf backend's trainer side): a batch whose
groups all had equal rewards is refilled with new tasks' groups, and the refill stops at its cap, filling the
slots left with dropped groups. A scripted policy decides which groups have equal rewards."""

from __future__ import annotations

import pytest

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer


@pytest.fixture(scope="module")
def scripted(script_module):
    """`dynamic_sampling_run.scripted_dapo_trainer` for the fast config with `overrides` (DAPO, no overlong filter)."""
    run = script_module("dynamic_sampling_run")
    return lambda overrides, uniform: run.scripted_dapo_trainer(config_from_dict({}, overrides + run.DAPO), uniform)


def _one_step(trainer: Trainer) -> dict[str, float]:
    try:
        return trainer.train_step(0)
    finally:
        trainer.close()


def test_a_batch_of_equal_reward_groups_is_refilled_with_new_tasks(fast_overrides, scripted):
    trainer, seeds = scripted(fast_overrides + ["algorithm.max_resample_rounds=3"], "first")
    m = _one_step(trainer)
    assert m["rollout/resample_rounds"] == 1.0  # one extra round filled both slots
    assert m["rollout/dropped_groups"] == 2.0 and m["rollout/filled_groups"] == 0.0
    assert m["rollout/accuracy"] == 0.5  # the trained groups are the new, informative ones (1 of 2 right)
    assert m["train/grad_norm"] > 0
    assert len(trainer.last_batch_ids) == 4 and trainer.stream.cursor == 4  # the stream moved past the extra tasks
    assert len(seeds) == 4 and len(set(seeds)) == 4  # the extra round's seeds differ from the first's


def test_the_refill_stops_at_its_cap_and_fills_with_dropped_groups(fast_overrides, scripted):
    trainer, seeds = scripted(fast_overrides + ["algorithm.max_resample_rounds=2"], "all")
    m = _one_step(trainer)
    assert m["rollout/resample_rounds"] == 2.0
    assert m["rollout/dropped_groups"] == 6.0  # 2 groups in each of 3 rounds, all with equal rewards
    assert m["rollout/filled_groups"] == 2.0  # both slots took dropped groups: the step still trains on 2 groups
    assert m["rollout/trajectories"] == 4.0 and m["rollout/accuracy"] == 0.0
    assert m["train/grad_norm"] == 0.0  # zero advantage everywhere
    assert trainer.stream.cursor == 6 and len(set(seeds)) == 6


@pytest.mark.slow
def test_two_processes_refill_in_lockstep(fast_overrides, run_ranks, script_module, tmp_path):
    """Only process 0 is short; both draw the same extra tasks, end with their 2 groups each, log the same counts."""
    run = script_module("dynamic_sampling_run")
    cfg = config_from_dict({}, fast_overrides + run.DAPO + ["trainer.tasks_per_step=4", "trainer.mini_batch_tasks=4"])
    ranks = run_ranks("dynamic_sampling_run.py", cfg, tmp_path)
    assert ranks[0]["world"] == 2
    for r in ranks:
        m = r["metrics"]
        assert m["rollout/resample_rounds"] == 1.0 and m["rollout/dropped_groups"] == 2.0
        assert m["rollout/filled_groups"] == 0.0
        assert m["rollout/trajectories"] == 8.0  # 2 groups of 2 on each process, summed
        assert r["cursor"] == 8  # the first 4 tasks, then 2 x the largest shortage (2)
    assert ranks[0]["batch_ids"] == ranks[1]["batch_ids"]  # the same tasks drawn on both
    assert len(ranks[0]["seeds"]) == 4 and len(ranks[1]["seeds"]) == 2  # process 1 sampled no extra round
    assert ranks[0]["metrics"]["rollout/accuracy"] == 0.5  # the trained groups: process 0's new ones, process 1's
