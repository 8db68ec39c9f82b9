"""Turns written to game the reward: an answer split across turns earns nothing, in either tool-call format.

The reward reads each policy turn as its own text (`agentenv.types.PolicyText`):
nothing written in one turn completes a tag or an answer opened in another.
"""

from __future__ import annotations

import json

import pytest

from agentenv.envs import AgentEnv
from agentenv.envs.testing import EchoTool

FORMATS = {"tags": {"tool_format": "tags"}, "hermes": {"tool_format": "hermes", "chat_template": "chatml_hermes"}}
CALL = {
    "tags": "<search>capital</search>",
    "hermes": "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": "capital"}}) + "\n</tool_call>",
}


def arpo_env(tok, fmt: str) -> AgentEnv:
    return AgentEnv([EchoTool("search")], tok, config=FORMATS[fmt])  # the default reward: ARPO's


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_answer_opened_before_a_call_and_closed_after_it_earns_nothing(tok, task, enc, fmt):
    env = arpo_env(tok, fmt)
    env.reset(options={"task": task})
    obs, _, term, _, info = env.step(enc("<answer>" + CALL[fmt]))
    assert not term and info["tool"] == "search" and "echo: capital" in tok.decode(obs)  # the call was answered
    _, r, term, _, info = env.step(enc("\\boxed{42}</answer>") + [tok.eos_token_id])
    assert term and info["finish_reason"] == "eos"
    assert r == -1.0 and not info["reward"]["format_ok"] and not info["reward"]["correct"]
    assert env.policy_text().turns[0].startswith("<answer>") and len(env.policy_text().turns) == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_answer_in_its_own_turn_after_a_call_still_earns_its_reward(tok, task, enc, fmt):
    env = arpo_env(tok, fmt)
    env.reset(options={"task": task})
    env.step(enc(CALL[fmt]))
    _, r, term, _, info = env.step(enc("<answer>\\boxed{42}</answer>"))
    assert term and info["finish_reason"] == "answer" and r == 1.0 and info["reward"]["correct"]


def test_a_number_split_across_turns_is_not_read_as_one(tok, task, enc):
    """The probe's case: `<answer>\\boxed{4` (an unfinished turn, answered as malformed), then `2}</answer>`."""
    env = arpo_env(tok, "tags")
    env.reset(options={"task": task})
    _, _, term, _, info = env.step(enc("<answer>\\boxed{4"))
    assert not term and info["tool"] == "invalid"
    _, r, term, _, info = env.step(enc("2}</answer>") + [tok.eos_token_id])
    assert term and info["finish_reason"] == "eos"
    assert r == -1.0 and not info["reward"]["correct"], info["reward"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_number_split_around_a_call_is_not_read_as_one(tok, task, enc, fmt):
    """The same split in either format, the first turn kept open by a real call: `<answer>\\boxed{4` + a call,
    then `2}</answer>` (read as one text, the answer would be 42)."""
    env = arpo_env(tok, fmt)
    env.reset(options={"task": task})
    _, _, term, _, info = env.step(enc("<answer>\\boxed{4" + CALL[fmt]))
    assert not term and info["tool"] == "search"
    _, r, term, _, info = env.step(enc("2}</answer>") + [tok.eos_token_id])
    assert term and r == -1.0 and not info["reward"]["correct"], info["reward"]
