"""check_agent_env passes a correct env and catches broken ones with clear messages."""

import pytest

from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.checker import check_agent_env
from agentenv.envs.testing import CounterTool, EchoTool, boxed_reward
from agentenv.types import Segment


def test_passes_a_correct_env(tok, task):
    env = AgentEnv([EchoTool("search"), CounterTool("python")], tok, reward_fn=boxed_reward)
    check_agent_env(env, task, seed=0)
    env.close()


class SharedForkEnv(AgentEnv):
    """Broken: the fork shares the context list with its parent."""

    def fork(self):
        new = super().fork()
        if self._started:
            new._context = self._context
        return new


class BadMaskEnv(AgentEnv):
    """Broken: records tool results as policy tokens."""

    def _append(self, seg):
        if seg.source == "tool":
            seg = Segment("policy", seg.token_ids, [0.0] * len(seg), [0.0] * len(seg))
        super()._append(seg)


class NondeterministicEnv(AgentEnv):
    """Broken: a result depends on how many episodes ran before."""

    episodes = 0

    def reset(self, **kw):
        NondeterministicEnv.episodes += 1
        return super().reset(**kw)

    async def _answer_call(self, parsed, info):
        return f"episode {NondeterministicEnv.episodes}"


@pytest.mark.parametrize(
    "cls,message",
    [
        (SharedForkEnv, "fork"),
        (BadMaskEnv, "must be a tool segment"),
        (NondeterministicEnv, "same seed"),
    ],
)
def test_catches_broken_envs(tok, task, cls, message):
    env = cls([EchoTool("search"), CounterTool("python")], tok, reward_fn=boxed_reward)
    with pytest.raises(AssertionError, match=message):
        check_agent_env(env, task)
