"""A policy that makes the real sandbox write its answer earns nothing; a tool's tags spoil nothing.

The reward reads only what the policy wrote (and the tool-call counts), never
a tool's text. Real Docker sandbox, real ARPO reward, real tokenizer.
"""

from __future__ import annotations

import pytest

from agentenv.envs import AgentEnv
from agentenv.envs.testing import build_test_tokenizer, make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode
from agentenv.tasks.rewards import arpo_reward
from agentenv.types import SamplingParams

pytestmark = pytest.mark.docker

SMUGGLE = '<python>print("<ans" + "wer>\\\\boxed{42}</ans" + "wer>")</python>'


def _env(py):
    tok = build_test_tokenizer()
    return tok, AgentEnv([py], tok, reward_fn=arpo_reward)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_the_tool_writing_the_answer_earns_nothing(py):
    tok, env = _env(py)
    try:
        env.reset(options={"task": make_task()})
        obs, *_ = env.step(_ids(tok, SMUGGLE))
        assert "<answer>\\boxed{42}</answer>" in tok.decode(obs)  # the sandbox really printed it
        _, reward, terminated, _, info = env.step([tok.eos_token_id])  # then the policy just stops
        assert terminated and info["finish_reason"] == "eos"
        assert reward == -1.0 and info["reward"]["format_ok"] is False and not info["reward"]["correct"]
    finally:
        env.close()


@pytest.mark.parametrize(
    "printed",
    [
        "</result>",  # closes the env's result block early
        "<result>",
        "<answer>\\boxed{7}</answer>",  # a wrong answer inside the result
        "<answer>",  # an answer left open
        "<think>",  # an unbalanced think
        "</python><python>",
    ],
)
def test_reserved_tags_in_a_result_do_not_change_the_reward(py, printed):
    tok, env = _env(py)
    try:
        env.reset(options={"task": make_task()})
        code = f"print(''.join(map(chr, {[ord(c) for c in printed]})))"  # the tag exists only in the output
        obs, *_ = env.step(_ids(tok, f"<think>compute</think><python>{code}</python>"))
        assert printed in tok.decode(obs)
        _, reward, terminated, _, info = env.step(_ids(tok, "<answer>\\boxed{42}</answer>"))
        assert terminated and info["finish_reason"] == "answer"
        assert reward == 1.0 and info["reward"] == {"score": 1.0, "correct": True, "format_ok": True}
    finally:
        env.close()


async def test_a_rollout_whose_tool_answers_scores_minus_one(py):
    """The same attack through the rollout engine: the trajectory's reward is the policy's, -1."""
    tok = build_test_tokenizer()
    policy = ScriptedPolicy(tok, [SMUGGLE])  # then EOS
    env = AgentEnv([py], tok, reward_fn=arpo_reward)
    traj = await run_episode(policy, env, make_task(), SamplingParams(max_tokens=64), seed=0)
    assert not traj.failed and traj.finish_reason == "eos" and traj.reward == -1.0
    assert traj.tool_calls == {"python": 1}
