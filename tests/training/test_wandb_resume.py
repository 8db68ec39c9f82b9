"""W&B (offline, the real library): a resumed run logs under the run id the run folder keeps; a new run gets its own."""

from __future__ import annotations

import json

import pytest

from agentenv.configs import LoggingConfig, config_from_dict
from agentenv.training.metrics import MetricsLogger
from agentenv.training.trainer import Trainer


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing leaves the machine; runs are written under dir
    monkeypatch.setenv("WANDB_SILENT", "true")


def offline_runs(out) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[-1] for p in (out / "wandb").glob("offline-run-*"))


def test_resumed_logger_continues_the_run_id_kept_in_the_run_folder(tmp_path):
    cfg = LoggingConfig(wandb=True, tensorboard=False, progress=False, wandb_project="agentenv-test")
    first = MetricsLogger(tmp_path, cfg, {"trainer": {"lr": 1e-3}})
    run_id = first._wandb.id
    first.log(1, {"rollout/reward": 0.5})
    first.close()
    assert json.loads((tmp_path / MetricsLogger.WANDB_RUN_FILE).read_text()) == {"id": run_id, "project": "agentenv-test"}

    resumed = MetricsLogger(tmp_path, cfg, {"trainer": {"lr": 1e-3}}, purge_step=2)
    assert resumed._wandb.id == run_id
    resumed.log(2, {"rollout/reward": 0.75})
    resumed.close()
    assert offline_runs(tmp_path) == [run_id, run_id]  # both sessions wrote to the same run

    fresh = MetricsLogger(tmp_path, cfg)  # not a resume: a run of its own, and the folder now names it
    assert fresh._wandb.id != run_id
    fresh.close()
    assert json.loads((tmp_path / MetricsLogger.WANDB_RUN_FILE).read_text())["id"] == fresh._wandb.id


def test_trainer_resume_reopens_the_same_wandb_run(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + ["logging.wandb=true"])
    trainer = Trainer(cfg)
    run_id = trainer.logger._wandb.id
    trainer.close()
    resumed = Trainer(cfg, resume=True)
    try:
        assert resumed.logger._wandb.id == run_id
    finally:
        resumed.close()
