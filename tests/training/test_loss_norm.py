"""The trainer's update normalizes over the whole mini-batch: the micro-batch size and the number of
processes do not change the gradient (token_mean, and seq_mean_token_mean with failed trajectories);
one update is one step of the learning-rate schedule on any number of processes."""

from __future__ import annotations

import pytest
import torch

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer


@pytest.fixture(scope="module")
def run(script_module):
    return script_module("loss_norm_run")


@pytest.fixture(scope="module")
def trainer(fast_module_overrides):
    t = Trainer(config_from_dict({}, fast_module_overrides))
    yield t
    t.close()


@pytest.fixture(scope="module")
def full_batch_gradients(trainer, run):
    """Every row in one micro-batch: the gradient of the mini-batch's mean loss."""
    batch = run.hand_batch(trainer)
    assert len(batch) <= 16
    return run.gradients(trainer, batch, micro_batch_size=16)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.abs().sum() > 0, "no gradient at all"
    err = ((a - b).norm() / b.norm()).item()
    assert err < 1e-5, f"relative difference {err:.2e}"


def test_micro_batch_size_does_not_change_the_gradient(trainer, full_batch_gradients, run):
    batch = run.hand_batch(trainer)
    per_row = batch.loss_mask.sum(dim=1)
    assert per_row.unique().numel() > 3 and (per_row == 0).sum() == len(run.FAILED)  # uneven, two failed
    for size in (1, 3):
        grads = run.gradients(trainer, batch, micro_batch_size=size)
        for agg in ("token_mean", "seq_mean_token_mean"):
            assert_same(grads[agg], full_batch_gradients[agg])


@pytest.mark.slow
def test_two_processes_give_the_single_process_gradient(fast_module_overrides, full_batch_gradients, run_ranks, tmp_path):
    cfg = config_from_dict({}, fast_module_overrides + [f"trainer.output_dir={tmp_path / 'run'}"])
    ranks = run_ranks("loss_norm_run.py", cfg, tmp_path)
    assert ranks[0]["world"] == 2 and ranks[0]["tokens"] != ranks[1]["tokens"]  # the ranks' shares differ
    # one update is one step of the learning-rate schedule (Accelerate would make it one per process)
    assert ranks[0]["scheduler_steps"] == ranks[1]["scheduler_steps"] == 1
    for agg in ("token_mean", "seq_mean_token_mean"):
        assert torch.equal(ranks[0][agg], ranks[1][agg])  # all-reduced
        assert_same(ranks[0][agg], full_batch_gradients[agg])


def test_a_step_with_truncated_importance_sampling_logs_the_mismatch(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + ["algorithm.rollout_correction=tis", "algorithm.rollout_correction_level=sequence"])
    trainer = Trainer(cfg)
    try:
        m = trainer.train_step(0)
    finally:
        trainer.close()
    # the hf sampler and the trainer share fp32 weights: ratios ~1, a tiny KL, weights ~1
    assert m["train/logprob_gap_mean"] < 1e-3
    assert 0.0 <= m["train/mismatch_kl"] < 1e-5
    assert m["train/is_ratio_max"] == pytest.approx(1.0, abs=1e-2)
    assert m["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-2) and m["train/is_capped_frac"] == 0.0
