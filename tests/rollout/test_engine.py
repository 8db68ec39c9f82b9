"""Rollout engine: episodes as coroutines, seeds, failures recorded, and the Episode building blocks."""

import asyncio
import dataclasses
import math
import time

import numpy as np
import pytest

from agentenv.envs.agent_env import AgentEnv, AgentEnvConfig
from agentenv.envs.testing import CounterTool, EchoTool, FailingTool, SleepTool, boxed_reward
from agentenv.errors import ConfigError
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import Episode, RolloutConfig, concat_generations, derive_seed, run_episode, run_group
from agentenv.tasks.prompts import render_prompt
from agentenv.types import Generation, SamplingParams

TURNS = ["<think>look it up</think><search>capital</search>", "<python>x</python>", "<answer>\\boxed{42}</answer>"]


class RandomPolicy:
    """Samples uniform tokens from a generator seeded by `params.seed` (logprob -log V, entropy log V)."""

    def __init__(self, tokenizer, n_tokens=6):
        self.tokenizer = tokenizer
        self.n = n_tokens
        self.seeds = []

    async def generate(self, prompt_ids, params):
        self.seeds.append(params.seed)
        rng = np.random.default_rng(params.seed)
        v = len(self.tokenizer)
        ids = [int(t) for t in rng.integers(3, v, size=min(self.n, params.max_tokens))]
        lp = -float(np.log(v))
        return Generation(ids, [lp] * len(ids), [-lp] * len(ids), "length")

    def load_weights(self, named_tensors):
        pass


class HangingPolicy:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(60)

    def load_weights(self, named_tensors):
        pass


def env_factory(tok, tools_for=None, **cfg):
    """make_env whose i-th env gets tools_for(i) (default: echo search + counter python)."""
    count = iter(range(10**6))
    registry = []

    def make_env():
        i = next(count)
        tools = tools_for(i) if tools_for else [EchoTool("search"), CounterTool("python", registry=registry)]
        return AgentEnv(tools, tok, reward_fn=boxed_reward, config=AgentEnvConfig(**cfg))

    make_env.registry = registry
    return make_env


async def test_episode_records_masks_context_and_reward(tok, task):
    make_env = env_factory(tok)
    traj = await run_episode(ScriptedPolicy(tok, TURNS), make_env(), task, SamplingParams(), seed=1)
    assert not traj.failed and traj.finish_reason == "answer" and traj.reward == 1.0
    prompt = render_prompt(tok, task.messages)
    assert traj.token_ids[: len(prompt)] == prompt and traj.prompt_len == len(prompt)
    assert traj.loss_mask == [1 if s.source == "policy" else 0 for s in traj.segments for _ in s.token_ids]
    assert [s.source for s in traj.segments] == ["prompt", "policy", "tool", "policy", "tool", "policy"]
    assert tok.decode(traj.segments[-1].token_ids) == TURNS[-1]  # stopped at </answer>, no EOS
    assert traj.tool_calls == {"search": 1, "python": 1}
    assert traj.info["generated_tokens"] == traj.num_policy_tokens and traj.info["t_end"] >= traj.info["t_start"]
    assert make_env.registry and all(t.closed for t in make_env.registry)  # episode tools closed


async def test_same_seed_same_trajectory(tok, task):
    make_env = env_factory(tok, max_context_tokens=200, max_result_tokens=64)
    params = SamplingParams(max_tokens=8)
    a = await run_group(RandomPolicy(tok), make_env, task, 3, params, seed=5)
    b = await run_group(RandomPolicy(tok), make_env, task, 3, params, seed=5)
    c = await run_group(RandomPolicy(tok), make_env, task, 3, params, seed=6)
    ids = lambda g: [t.token_ids for t in g]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    assert len({tuple(x) for x in ids(a)}) == 3  # episodes of a group differ


async def test_per_turn_seeds_and_caps(tok, task):
    pol = RandomPolicy(tok, n_tokens=50)
    env = env_factory(tok, max_context_tokens=120, max_result_tokens=40)()
    traj = await run_episode(pol, env, task, SamplingParams(max_tokens=7), seed=3)
    assert len(pol.seeds) >= 1 and len(set(pol.seeds)) == len(pol.seeds)
    assert pol.seeds[0] == derive_seed(3, 0)
    # A random turn is not a call: the episode ends with "length" after one 7-token turn.
    assert traj.finish_reason == "length" and traj.num_policy_tokens == 7


async def test_slow_tool_does_not_delay_other_episodes(tok, task):
    def tools_for(i):
        return [SleepTool("search", 1.0) if i == 0 else EchoTool("search")]

    pol = ScriptedPolicy(tok, ["<search>q</search>", "<answer>\\boxed{42}</answer>"], delay_s=0.02)
    t0 = time.monotonic()
    group = await run_group(pol, env_factory(tok, tools_for), task, 4, SamplingParams(), seed=0)
    ends = [t.info["t_end"] - t0 for t in group]
    assert all(not t.failed and t.reward == 1.0 for t in group)
    assert ends[0] >= 1.0
    assert max(ends[1:]) < 0.5, f"fast episodes waited for the slow tool: {ends}"


async def test_failing_episode_does_not_abort_the_group(tok, task):
    def tools_for(i):
        return [FailingTool("search") if i == 1 else EchoTool("search")]

    pol = ScriptedPolicy(tok, ["<search>q</search>", "<answer>\\boxed{42}</answer>"])
    group = await run_group(pol, env_factory(tok, tools_for), task, 3, SamplingParams(), seed=0)
    bad = group.trajectories[1]
    assert bad.failed and bad.finish_reason == "error" and "ToolError" in bad.error and "unreachable" in bad.error
    assert set(bad.loss_mask) == {0} and bad.reward == 0.0
    assert all(not t.failed and t.reward == 1.0 for i, t in enumerate(group) if i != 1)
    assert group.info["failed"] == 1


async def test_timeouts_are_recorded_as_failures(tok, task):
    env = env_factory(tok)()
    traj = await run_episode(
        HangingPolicy(tok), env, task, SamplingParams(), seed=0, config=RolloutConfig(generation_timeout_s=0.05)
    )
    assert traj.failed and "timed out after 0.05 s" in traj.error
    pol = ScriptedPolicy(tok, ["<search>q</search>"] * 3 + ["<answer>\\boxed{1}</answer>"])
    slow = env_factory(tok, lambda i: [SleepTool("search", 0.5)])()
    traj = await run_episode(pol, slow, task, SamplingParams(), seed=0, config=RolloutConfig(episode_timeout_s=1.0))
    assert traj.failed and "episode timed out after 1 s" in traj.error and traj.finish_reason == "error"


async def test_make_env_failure_is_a_failed_trajectory(tok, task):
    def broken():
        raise RuntimeError("no tools today")

    group = await run_group(ScriptedPolicy(tok, TURNS), broken, task, 2, SamplingParams(), seed=0)
    assert all(t.failed and "no tools today" in t.error for t in group)


async def test_episode_partial_turn_and_fork(tok, task):
    """ARPO's building blocks: k tokens after a result, continue, fork with new seeds."""
    make_env = env_factory(tok)
    turn1 = "<think>a long careful thought about it</think><python>a</python>"
    pol = ScriptedPolicy(tok, ["<search>q</search>", turn1, "<python>b</python>", "<answer>\\boxed{42}</answer>"])
    ep = Episode(pol, make_env(), SamplingParams(), seed=11)
    ep.reset(task)
    await ep.play_turn()  # search call, result appended
    head = await ep.generate(max_tokens=5)  # the k tokens after the result (entropy probe)
    assert head.finish_reason == "length" and len(head.token_ids) == 5
    full = await ep.generate(prefix=head)
    assert full.token_ids == list(tok.encode(turn1, add_special_tokens=False)) and full.finish_reason == "stop"
    assert await ep.generate(prefix=full) is full  # a finished turn is not continued
    branch = ep.fork(seed=12)
    r = await ep.step(full)
    assert tok.decode(r.observation) == "<result>\ncount=1\n</result>"
    # The branch is still before the python call: stepping it runs its own forked session.
    rb = await branch.step(full)
    assert tok.decode(rb.observation) == "<result>\ncount=1\n</result>"
    await branch.run()
    await ep.run()
    t, tb = ep.trajectory(), branch.trajectory()
    assert tb.parent_uid == t.uid and t.token_ids[: tb.branch_token] == tb.token_ids[: tb.branch_token]
    assert t.reward == tb.reward == 1.0
    assert tb.info["generated_tokens"] < t.info["generated_tokens"]  # the shared prefix is counted once
    await ep.aclose()
    await branch.aclose()
    assert all(x.closed for x in make_env.registry)


def test_concat_generations():
    a = Generation([1, 2], [-0.1, -0.2], [1.0, 2.0], "length")
    b = Generation([3], [-0.3], [3.0], "stop", "</search>")
    c = concat_generations(a, b)
    assert c.token_ids == [1, 2, 3] and c.logprobs == [-0.1, -0.2, -0.3] and c.entropies == [1.0, 2.0, 3.0]
    assert c.finish_reason == "stop" and c.stop_string == "</search>" and c.versions is None
    v = concat_generations(dataclasses.replace(a, versions=[3, 3]), dataclasses.replace(b, versions=[4]))
    assert v.versions == [3, 3, 4]  # a turn that a weight push overtook keeps each token's version
    assert concat_generations(dataclasses.replace(a, versions=[3, 3]), b).versions is None
    with pytest.raises(ValueError, match="2 tokens but 1 versions"):
        Generation([1, 2], [-0.1, -0.2], [1.0, 2.0], "length", versions=[1])
    with pytest.raises(ValueError):
        concat_generations()


def test_config_and_seeds():
    with pytest.raises(ConfigError, match="rollout.generation_timeout_s"):
        RolloutConfig(generation_timeout_s=0)
    with pytest.raises(ConfigError, match="rollout.episode_timeout_s"):
        RolloutConfig(episode_timeout_s=-1)
    with pytest.raises(ConfigError, match=r"rollout\.episode_timeout_s: must be a finite number >= 1, got 0.5"):
        RolloutConfig(episode_timeout_s=0.5)  # no trajectory could finish
    with pytest.raises(ConfigError, match="rollout.generation_timeout_s"):
        RolloutConfig(generation_timeout_s=math.inf)
    assert RolloutConfig(generation_timeout_s=600, episode_timeout_s=20).generation_limit_s == 20
    with pytest.raises(ConfigError, match="rollout.max_concurrency"):
        RolloutConfig(max_concurrency=0)
    assert derive_seed(1, 2) == derive_seed(1, 2) != derive_seed(2, 1)
    assert 0 <= derive_seed(-5, 3) < 2**63
