"""Kill a training run with SIGKILL after a checkpoint; --resume continues exactly there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentenv.configs import config_from_dict
from agentenv.training.checkpoint import latest_checkpoint, read_state
from agentenv.training.data import TaskStream
from agentenv.training.trainer import Trainer


@pytest.mark.slow
def test_sigkill_then_resume_draws_the_same_next_batch(fast_overrides, tmp_path, train_until_checkpoint):
    overrides = fast_overrides + ["trainer.steps=4"]
    cfg = config_from_dict({}, overrides)
    out = Path(cfg.trainer.output_dir)
    train_until_checkpoint(cfg, tmp_path / "run.yaml", step=2)

    last = latest_checkpoint(out)
    k = read_state(last)["step"]
    assert 2 <= k < 4
    n = cfg.trainer.tasks_per_step

    trainer = Trainer(cfg, resume=True)
    try:
        assert trainer.start_step == k
        # the batch an uninterrupted run would draw next
        fresh = TaskStream(trainer.rt.tasks.train, seed=cfg.trainer.seed)
        fresh.next_batch(k * n)
        expected = [t.id for t in fresh.peek(n)]
        assert [t.id for t in trainer.stream.peek(n)] == expected
        # the weights are the checkpoint's
        saved = load_file(str(last / "model" / "model.safetensors"))
        live = trainer.unwrapped().state_dict()
        assert saved and all(torch.equal(saved[key], live[key]) for key in saved)
        trainer.train()
    finally:
        trainer.close()

    records = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    resumed = [r for r in records if r["step"] == k + 1][-1]
    assert resumed["tasks"] == expected
    assert read_state(latest_checkpoint(out))["step"] == 4
