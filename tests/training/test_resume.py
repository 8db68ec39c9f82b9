"""Kill a training run with SIGKILL after a checkpoint; --resume continues exactly there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentenv.configs import config_from_dict
from agentenv.training.checkpoint import latest_checkpoint, read_state
from agentenv.training.data import TaskStream
from agentenv.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigkill_then_resume_draws_the_same_next_batch(fast_overrides, tmp_path):
    overrides = fast_overrides + ["trainer.steps=4"]
    cfg = config_from_dict({}, overrides)
    out = Path(cfg.trainer.output_dir)
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentenv.cli", "train", str(cfg_file)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.time() + 600
    try:
        while time.time() < deadline:
            last = latest_checkpoint(out)
            if last is not None and read_state(last)["step"] >= 2:
                break
            if proc.poll() is not None:
                pytest.fail(f"training exited early:\n{proc.stdout.read().decode()[-3000:]}")
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint at step 2 within 600 s")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

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
