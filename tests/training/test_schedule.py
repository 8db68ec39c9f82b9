"""The learning-rate schedule, by hand; its options are validated with the dotted key."""

import math

import pytest

from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.training.schedule import lr_factor


def test_warmup_then_constant():
    assert [lr_factor(u, 10, 4, "constant") for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_then_cosine_to_the_floor():
    # 2 warmup updates, then 8 along half a cosine: p = (u - 2) / 8
    got = [lr_factor(u, 10, 2, "cosine", min_lr_ratio=0.1) for u in range(10)]
    want = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (u - 2) / 8)) for u in range(2, 10)]
    assert got == pytest.approx(want)
    assert got[2] == 1.0 and got[6] == pytest.approx(0.55) and got[-1] > 0.1  # the floor is reached after the last
    assert lr_factor(10, 10, 2, "cosine", 0.1) == pytest.approx(0.1) and lr_factor(50, 10, 2, "cosine", 0.1) == pytest.approx(0.1)
    assert [lr_factor(u, 4, 0, "cosine") for u in range(4)] == pytest.approx([1.0, 0.8535534, 0.5, 0.1464466])


def test_schedule_options_are_checked():
    cfg = config_from_dict({"trainer": {"lr_schedule": "cosine", "min_lr_ratio": 0.1}})
    assert cfg.trainer.lr_schedule == "cosine"
    with pytest.raises(ConfigError, match=r"trainer.lr_schedule: must be one of 'constant', 'cosine', got 'linear'"):
        config_from_dict({"trainer": {"lr_schedule": "linear"}})
    with pytest.raises(ConfigError, match=r"trainer.min_lr_ratio: must be in \[0, 1\]"):
        config_from_dict({"trainer": {"min_lr_ratio": 1.5}})
    with pytest.raises(ConfigError, match=r"trainer.min_lr_ratio: must be a finite number >= 0, got -0.1"):
        config_from_dict({"trainer": {"min_lr_ratio": -0.1}})


def test_the_trainer_follows_the_configured_schedule(fast_overrides):
    # 2 steps of 2 mini-batches of 1 task: 4 updates, the first a warmup
    over = ["trainer.lr_schedule=cosine", "trainer.min_lr_ratio=0.2", "trainer.warmup_steps=1", "trainer.mini_batch_tasks=1"]
    from agentenv.training.trainer import Trainer

    trainer = Trainer(config_from_dict({}, fast_overrides + over))
    try:
        assert trainer.total_updates == 4
        lrs = [trainer.opt.param_groups[0]["lr"]]
        for _ in range(3):
            trainer.opt.step()
            trainer.sched.step()
            lrs.append(trainer.opt.param_groups[0]["lr"])
        base = trainer.cfg.trainer.lr
        assert lrs == pytest.approx([base * lr_factor(u, 4, 1, "cosine", 0.2) for u in range(4)])
        assert lrs[1] == pytest.approx(base) and lrs[3] < lrs[2] < lrs[1]
    finally:
        trainer.close()
