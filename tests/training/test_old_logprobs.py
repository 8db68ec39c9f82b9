"""The update's first mini-batch supplies its own rows' old logprobs (no recompute for them): the same step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer


def _one_step(overrides: list[str], fuse: bool) -> tuple[dict, dict, list[int]]:
    """Step 1's metrics, the weights after it, and how many rows each recompute scored."""
    trainer = Trainer(config_from_dict({}, overrides))
    assert trainer.updater.fuse_old_logprobs  # GRPO, no reference model, no dropout: qualifies
    trainer.updater.fuse_old_logprobs = fuse
    scored: list[int] = []
    recompute = trainer.updater.recompute

    def counting(batch, model, rows=None):
        scored.append(len(batch) if rows is None else int(rows.sum()))
        return recompute(batch, model, rows)

    trainer.updater.recompute = counting  # type: ignore[method-assign]
    trainer.train()
    out = Path(trainer.cfg.trainer.output_dir)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    weights = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    return metrics, weights, scored


@pytest.mark.slow
def test_the_first_mini_batch_yields_the_old_logprobs_and_the_step_is_unchanged(fast_overrides, tmp_path):
    """Two mini-batches a step: the first one's rows are not recomputed; losses, ratios, the logprob gap to the
    sampler and the weights after the step equal those of the run that recomputes every row."""
    base = fast_overrides + ["trainer.steps=1", "trainer.mini_batch_tasks=1", "trainer.eval_tasks=0"]
    lr = 0.001  # FAST's trainer.lr
    fused, w_fused, scored_fused = _one_step(base + [f"trainer.output_dir={tmp_path / 'fused'}"], True)
    plain, w_plain, scored_plain = _one_step(base + [f"trainer.output_dir={tmp_path / 'plain'}"], False)
    rows = 2 * 2  # tasks_per_step x group_size
    assert scored_plain == [rows] and scored_fused == [rows // 2]  # the second mini-batch's rows only
    assert fused["rollout/trajectories"] == plain["rollout/trajectories"] == rows
    assert fused["rollout/reward"] == plain["rollout/reward"]  # the same rollouts: the step starts alike
    # The old logprobs now come from the update's forward (train mode, the mini-batch's padding) instead of the
    # recompute's (eval mode, the whole batch's padding): the same values up to float32 rounding, summed over at
    # most 768 positions: eps32 x 768 ~ 1e-4 relative.
    keys = [k for k in plain if k.startswith("train/") and isinstance(plain[k], float)]
    assert "train/pg_loss" in keys or any("loss" in k for k in keys), keys
    # The metrics of old minus sampler logprobs are rounding themselves (~1e-5): absolute, a logprob's |16| x
    # eps32 x sqrt(256) (the hidden size each logit sums over) ~ 3e-5, so 1e-4.
    for k in keys:
        absolute = any(w in k for w in ("gap", "mismatch", "is_ratio"))
        tol = {"rel_tol": 0.0, "abs_tol": 1e-4} if absolute else {"rel_tol": 1e-4, "abs_tol": 1e-6}
        assert math.isclose(fused[k], plain[k], **tol), (k, fused[k], plain[k])
    # Adam's first step moves a weight by lr x g / (|g| + eps): a 1e-4 relative change of g moves it by < 1e-4 lr.
    for name in w_plain:
        torch.testing.assert_close(w_fused[name], w_plain[name], rtol=0.0, atol=1e-4 * lr)
