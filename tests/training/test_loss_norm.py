"""The trainer's update normalizes over the whole mini-batch: the micro-batch size and the number of
processes do not change the gradient (token_mean, and seq_mean_token_mean with failed trajectories);
one update is one step of the learning-rate schedule on any number of processes."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load("loss_norm_run")


@pytest.fixture(scope="module")
def trainer(fast_module_overrides):
    t = Trainer(config_from_dict({}, fast_module_overrides))
    yield t
    t.close()


@pytest.fixture(scope="module")
def full_batch_gradients(trainer):
    """Every row in one micro-batch: the gradient of the mini-batch's mean loss."""
    batch = run.hand_batch(trainer)
    assert len(batch) <= 16
    return run.gradients(trainer, batch, micro_batch_size=16)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.abs().sum() > 0, "no gradient at all"
    err = ((a - b).norm() / b.norm()).item()
    assert err < 1e-5, f"relative difference {err:.2e}"


def test_micro_batch_size_does_not_change_the_gradient(trainer, full_batch_gradients):
    batch = run.hand_batch(trainer)
    per_row = batch.loss_mask.sum(dim=1)
    assert per_row.unique().numel() > 3 and (per_row == 0).sum() == len(run.FAILED)  # uneven, two failed
    for size in (1, 3):
        grads = run.gradients(trainer, batch, micro_batch_size=size)
        for agg in ("token_mean", "seq_mean_token_mean"):
            assert_same(grads[agg], full_batch_gradients[agg])


@pytest.mark.slow
def test_two_processes_give_the_single_process_gradient(fast_module_overrides, full_batch_gradients, launch_cmd, tmp_path):
    cfg = config_from_dict({}, fast_module_overrides + [f"trainer.output_dir={tmp_path / 'run'}"])
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    cmd = launch_cmd(HERE / "loss_norm_run.py", str(cfg_file), str(tmp_path), nproc=2)
    proc = subprocess.run(cmd, cwd=HERE.parents[1], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
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
