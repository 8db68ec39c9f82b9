"""Held-out evaluation and the trainer's accuracy read correctness where the env records it."""

from __future__ import annotations

import asyncio

from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.testing import EchoTool, build_test_tokenizer, make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.evaluate import evaluate
from agentenv.types import SamplingParams


def test_accuracy_counts_the_episodes_the_reward_judged_correct():
    tok = build_test_tokenizer()
    right, wrong = make_task(task_id="right"), make_task(answer="41", task_id="wrong")
    policy = ScriptedPolicy(tok, ["<search>six times seven</search>", "<answer>\\boxed{42}</answer>"])
    envs: list[AgentEnv] = []

    def make_env():  # the default reward: ARPO's (format, then correctness)
        envs.append(AgentEnv([EchoTool("search")], tok))
        return envs[-1]

    report = asyncio.run(evaluate(policy, make_env, [right, wrong], samples=2, params=SamplingParams(), seed=0))
    assert report.n_tasks == 2 and report.n_samples == 4
    assert report.accuracy == 0.5 and report.pass_at[1] == 0.5 and report.pass_at[2] == 0.5
    assert report.reward == 0.5  # 1 for the right answer, 0 for a well-formed wrong one
    traj = envs[0].trajectory()
    assert traj.info["reward"]["correct"] is traj.correct is (traj.task_id == "right")
