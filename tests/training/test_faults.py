"""Faults during training: a hanging group, a raising sampler, a run whose trajectories all fail, NaN weights.

Each is the attack or fault it names, on the real trainer with the tiny model;
a scripted policy or tool stands in only where the fault must hit exactly.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch

from agentenv.configs import config_from_dict
from agentenv.errors import AgentEnvError, InfraError
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.build import build_runtime, make_env_factory
from agentenv.training.checkpoint import latest_checkpoint
from agentenv.training.metrics import read_metrics
from agentenv.training.trainer import Trainer
from agentenv.types import ToolResult


class HangingSearch:
    """Never answers a query containing `hang` (an endpoint that accepts the connection and stalls)."""

    name = "search"

    async def __call__(self, query: str) -> ToolResult:
        if "hang" in query:
            await asyncio.sleep(3600)
        return ToolResult(text="Page 1: Nothing\nNo such fact.")

    def fork(self):
        return self

    async def aclose(self) -> None:
        return None


def _scripted_trainer(overrides, hang_question: str | None = None) -> Trainer:
    """The real trainer over the tiny model's weights, with a scripted rollout policy and a search
    that hangs for the task asking `hang_question`."""
    cfg = config_from_dict({}, overrides)
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))

    def turn(prompt_ids: list[int]) -> str:
        text = rt.tokenizer.decode(prompt_ids)
        if "No such fact." in text:  # after the result
            return "<answer>\\boxed{0}</answer>"
        return "<search>hang now</search>" if hang_question and hang_question in text else "<search>fact</search>"

    rt.policy = ScriptedPolicy(rt.tokenizer, turn)
    rt.tools = {"search": HangingSearch()}
    rt.make_env = make_env_factory(cfg.env, rt.tools, rt.tokenizer)
    return Trainer(cfg, runtime=rt)


def test_a_hanging_group_fails_at_its_own_deadline_and_the_step_goes_on(fast_overrides):
    cfg = config_from_dict({}, fast_overrides)
    a, b = build_runtime(cfg, resolve_model_path(cfg.model.path)).tasks.train[:2]
    overrides = fast_overrides + ["rollout.episode_timeout_s=2", "env.tool_timeout_s=60"]
    trainer = _scripted_trainer(overrides, hang_question=a.messages[-1]["content"])
    try:
        t0 = time.monotonic()
        groups = trainer.run(trainer.rollouts.groups([a, b], step=0, indices=[0, 1]))
        elapsed = time.monotonic() - t0
    finally:
        trainer.close()
    hung, healthy = groups
    assert all(t.failed and "timed out after 2 s" in t.error for t in hung), [t.error for t in hung]
    assert all(not t.failed and t.finish_reason == "answer" for t in healthy)
    assert elapsed < 5.0, elapsed  # rollout.episode_timeout_s reached the sampler: 2 s, not the tool's 60 s


def test_a_sampler_that_raises_loses_its_own_group_only(fast_overrides):
    trainer = _scripted_trainer(fast_overrides)
    real = trainer.algorithm.sampler
    broken_task = trainer.rt.tasks.train[0]

    class Flaky:
        def __init__(self, inner):
            self.inner = inner

        async def sample(self, policy, make_env, task, params, seed):
            if task.id == broken_task.id:
                raise RuntimeError("sampler bug")
            return await self.inner.sample(policy, make_env, task, params, seed)

    trainer.algorithm.sampler = lambda *args: Flaky(real(*args))
    try:
        groups = trainer.run(trainer.rollouts.groups(trainer.rt.tasks.train[:2], step=0, indices=[0, 1]))
    finally:
        trainer.close()
    assert len(groups[0]) == trainer.algorithm.group_size()
    assert all(t.failed and "RuntimeError: sampler bug" in t.error for t in groups[0])
    assert not any(t.failed for t in groups[1])


class BrokenEnvFactory:
    def __call__(self):
        raise InfraError("the search backend is down (test fault)")


def test_a_run_whose_trajectories_all_fail_stops_with_the_reason(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + ["trainer.steps=6", "trainer.max_failed_steps=2"])
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))
    rt.make_env = BrokenEnvFactory()
    trainer = Trainer(cfg, runtime=rt)
    with pytest.raises(AgentEnvError, match="every trajectory failed in 2 consecutive steps") as ei:
        trainer.train()
    assert "the search backend is down" in str(ei.value) and "trainer.max_failed_steps" in str(ei.value)
    records = read_metrics(cfg.trainer.output_dir + "/metrics.jsonl")
    steps = [r for r in records if "rollout/failed" in r]
    assert [r["step"] for r in steps] == [1, 2]  # it stopped at step 2 of 6
    assert all(r["rollout/failed"] == r["rollout/trajectories"] == 4 for r in steps)


def test_weights_that_stop_being_finite_stop_the_run_before_a_checkpoint(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + ["trainer.steps=4", "trainer.eval_tasks=0"])
    trainer = Trainer(cfg)
    with torch.no_grad():  # an overflow in one weight (what lr=1e38 would do)
        next(trainer.unwrapped().parameters()).view(-1)[0] = math.inf
    with pytest.raises(AgentEnvError, match="weights stopped being finite at step 1"):
        trainer.train()
    assert latest_checkpoint(cfg.trainer.output_dir) is None  # nothing broken was saved
    rec = [r for r in read_metrics(cfg.trainer.output_dir + "/metrics.jsonl") if r["step"] == 1][0]
    # the non-finite loss is logged (as NaN), not dropped
    assert rec["train/weights_finite"] == 0.0 and math.isnan(rec["train/pg_loss"]), rec
