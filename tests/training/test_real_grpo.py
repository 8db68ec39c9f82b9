"""GRPO on a real pretrained model: configs/real_smollm2_grpo.yaml (SmolLM2-135M-Instruct, hermes calls, ARPO's
questions, replayed search), made small, two steps in process on the hf backend."""

from __future__ import annotations

import pytest
import torch

from agentenv.configs import load_config
from agentenv.tasks.rewards import REWARDS, RewardResult, arpo_reward, register_reward
from agentenv.training.trainer import Trainer

pytestmark = pytest.mark.slow


def searched(response, task, tool_calls) -> RewardResult:
    """ARPO's reward, plus 1 when a search call went through: a 135M model almost never answers in ARPO's format
    (every reward -1, no gradient), but it closes its JSON call in some samples and not in others."""
    r = arpo_reward(response, task, tool_calls)
    return RewardResult(r.score + float(tool_calls.get("search", 0) > 0), r.correct, r.format_ok, r.answer, r.reason)


def test_two_grpo_steps_change_the_real_model_and_keep_the_context_exact(tmp_path, smollm2_path):
    if "test-searched" not in REWARDS:
        register_reward("test-searched", searched)
    cfg = load_config("configs/real_smollm2_grpo.yaml", [
        "policy.backend=hf", "policy.max_turn_tokens=32", "env.reward=test-searched", "env.max_context_tokens=768",
        "env.tasks.path=/work/shared/data/arpo/valid.parquet", "trainer.steps=2", "trainer.tasks_per_step=1",
        "trainer.mini_batch_tasks=1", "trainer.micro_batch_size=2", "trainer.lr=1.0e-4", "trainer.eval_every=0",
        "trainer.checkpoint_every=100", "logging.progress=false", f"trainer.output_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    trainer = Trainer(cfg)
    before = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    try:
        rewards, grads, results = [], [], 0
        for step in range(2):
            m = trainer.train_step(step)
            # A failed trajectory would be one whose context drifted from the template's rendering (a ConfigError).
            assert m["rollout/failed"] == 0, m
            rewards.append(m["rollout/reward"])
            grads.append(m["train/grad_norm"])
            results += m["rollout/tool_calls_per_traj"]
        assert results > 0, "no tool result in two steps"
        assert max(grads) > 0, (rewards, grads)
        assert m["train/logprob_gap_mean"] < 2e-3, m  # sampler and trainer: the same fp32 weights
        after = trainer.unwrapped().state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert len(changed) > len(before) // 2, f"{len(changed)} of {len(before)} tensors changed"
    finally:
        trainer.close()
