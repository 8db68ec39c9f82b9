"""The reward gate: every reward, from any source, is a finite number in its reward's range or the trajectory
fails, counted by kind; a verifier that raises or runs away scores the minimum and costs no other episode.

The verifiers are reasoning-gym's own, on the answers that broke them (issue 37: boxnet on "0", prime_factorization
on "-inf" raise; countdown on "1e999999" ran 65 s), driven through a real AgentEnv and the real endpoint."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time

import pytest

from agentenv.configs import config_from_dict
from agentenv.envs import AgentEnv
from agentenv.envs.chat import ChatTemplate
from agentenv.envs.testing import make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.endpoint.agent import AgentRunner
from agentenv.tasks import rewards
from agentenv.tasks.rewards import (
    REWARD_ERROR_KINDS,
    RewardError,
    RewardGate,
    RewardResult,
    bounded,
    check_reward,
    get_reward,
    reward_error_counts,
    verifier_timeout_s,
)
from agentenv.tasks.worker import get_worker
from agentenv.types import SamplingParams

PARAMS = SamplingParams(max_tokens=200)


def rg_task(dataset: str, **opts):
    tasks = {"source": "reasoning_gym", "datasets": {dataset: {"size": 1, **opts}}, "eval_size": 0}
    return config_from_dict({"env": {"tools": {}, "reward": "reasoning_gym", "tasks": tasks}}).env.tasks.load().train[0]


async def episode(tok, answer: str, task, reward_fn, **cfg):
    env = AgentEnv([], tok, reward_fn=reward_fn, config={"max_context_tokens": 4096, **cfg})
    return await run_episode(ScriptedPolicy(tok, [f"<answer>{answer}</answer>"]), env, task, PARAMS, seed=0)


@pytest.mark.parametrize("value, kind", [
    (float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "inf"), (1.5, "out_of_range"), (-2.0, "out_of_range"),
    ("1.0", "not_a_number"), (None, "not_a_number"), (True, "not_a_number"),
])  # fmt: skip
def test_the_gate_names_what_is_wrong_with_a_number(value, kind):
    with pytest.raises(RewardError) as e:
        check_reward(value, (0.0, 1.0), "the reward")
    assert e.value.kind == kind and kind in REWARD_ERROR_KINDS
    assert check_reward(1, (0.0, 1.0), "the reward") == 1.0


@pytest.mark.parametrize("score, kind", [(float("nan"), "nan"), (float("inf"), "inf"), (7.0, "out_of_range")])
async def test_an_env_reward_that_is_no_finite_number_in_range_fails_its_trajectory_counted(tok, score, kind):
    from agentenv.tasks.rewards import bounded

    @bounded(0.0, 1.0)
    def broken(response, task, tool_calls):
        return score, True

    traj = await episode(tok, "42", make_task(), broken)
    assert traj.failed and kind in traj.error and traj.reward == 0.0 and sum(traj.loss_mask) == 0
    assert traj.info["reward"]["error"] == kind
    assert reward_error_counts([traj])[f"reward_errors/{kind}"] == 1.0


@pytest.mark.parametrize("dataset, junk", [("boxnet", "0"), ("prime_factorization", "-inf")])
async def test_a_verifier_that_raises_scores_the_minimum_and_is_trained_on(tok, dataset, junk):
    task = rg_task(dataset)
    traj = await episode(tok, junk, task, get_reward("reasoning_gym"), reward_timeout_s=120.0)  # a loaded machine
    assert not traj.failed, traj.error  # the wrong answer is trained on, not masked
    assert traj.reward == 0.0 and not traj.correct and sum(traj.loss_mask) > 0
    assert traj.info["reward"]["error"] == "verifier_raised"


@pytest.mark.slow
async def test_a_runaway_verifier_is_cut_off_at_the_time_limit(tok):
    task = rg_task("countdown")
    t0 = time.monotonic()
    traj = await episode(tok, "1e999999", task, get_reward("reasoning_gym"), reward_timeout_s=1.0)
    took = time.monotonic() - t0
    assert not traj.failed and traj.reward == 0.0 and traj.info["reward"]["error"] == "verifier_timeout"
    assert took < 45.0, took  # the worker is killed at 1 s (it ran 65 s unbounded); the rest is its restart on a loaded CPU
    right = await episode(tok, task.ground_truth, task, get_reward("reasoning_gym"))
    assert right.reward == 1.0  # a fresh worker answers


_episodes = itertools.count()


async def nan_once_agent(client, task) -> float:
    """Asks once, then returns NaN in its first episode and 1.0 in the others."""
    await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    return float("nan") if next(_episodes) == 0 else 1.0


async def answer_agent(client, task) -> str:
    """Returns the model's reply as its answer (scored by env.reward)."""
    resp = await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    return resp.choices[0].message.content or ""


async def agent_group(tok, agent, reward_fn, n: int, reply: str = "5", task=None, **runner_kw):
    """`n` episodes of `agent` through the real endpoint, the policy replying `reply`; the group and the runner's metrics."""
    chat = ChatTemplate.from_config(tok, "chatml_hermes", {})
    runner = AgentRunner(agent, chat, reward_fn, RolloutConfig(), 4096, **runner_kw)
    try:
        group = await runner.run_group(ScriptedPolicy(tok, lambda prompt: reply), task or make_task("2 + 3?", "5"), n,
                                       PARAMS, seed=0)  # fmt: skip
        return group, runner.metrics()
    finally:
        await runner.aclose()


async def test_an_agents_nan_fails_its_episode_only_and_the_advantages_stay_finite(tok):
    from agentenv.algorithms import get_algorithm

    global _episodes
    _episodes = itertools.count()
    group, _ = await agent_group(tok, nan_once_agent, get_reward("exact"), 3)
    bad = [t for t in group if t.failed]
    assert len(bad) == 1 and "nan" in bad[0].error and bad[0].info["reward"]["error"] == "nan"
    assert [t.reward for t in group if not t.failed] == [1.0, 1.0]
    assert reward_error_counts(list(group))["reward_errors/nan"] == 1.0
    adv = get_algorithm("grpo")().advantages(group)  # the failed trajectory is masked, and no NaN reaches the math
    assert all(bool(a.isfinite().all()) for a in adv)


async def scored_nan_part_agent(client, task):
    """An environment's own score (a verifiers rubric) with one part NaN in its first episode."""
    from agentenv.tasks.rewards import Scored

    await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    first = next(_episodes) == 0
    return Scored(score=1.0, correct=True, parts={"format": math.nan if first else 1.0, "answer": 1.0})


async def test_a_rubrics_nan_part_fails_its_episode_only(tok):
    global _episodes
    _episodes = itertools.count()
    group, parts = await agent_group(tok, scored_nan_part_agent, get_reward("exact"), 3)
    bad = [t for t in group if t.failed]
    assert len(bad) == 1 and bad[0].info["reward"]["error"] == "nan" and "'format'" in bad[0].error
    assert [t.reward for t in group if not t.failed] == [1.0, 1.0]
    assert parts["rollout/reward_part/format"] == 1.0  # the NaN never reached the logged mean


async def test_an_agents_answer_whose_verifier_raises_scores_the_minimum_and_the_group_goes_on(tok):
    group, _ = await agent_group(tok, answer_agent, get_reward("reasoning_gym"), 2, "0", rg_task("boxnet"),
                                 reward_timeout_s=120.0)  # fmt: skip
    assert len(group) == 2 and not any(t.failed for t in group), [t.error for t in group]
    assert all(t.reward == 0.0 and t.info["reward"]["error"] == "verifier_raised" for t in group)


def test_what_a_check_prints_is_not_taken_for_its_answer_nor_the_next_ones():
    """A verifier that prints (reasoning-gym's tower_of_hanoi prints "Error validating move ..." on a bad move)
    must not speak on the worker's reply channel: a printed "1" was taken for the reply (a TypeError), and
    the real reply was then read as the *next* call's answer, one episode's verdict given to another."""
    from agentenv.tasks.worker import VerifierWorker

    worker = VerifierWorker()
    try:
        assert worker.call("builtins:print", "1", timeout_s=30.0) is None  # print's own value
        assert worker.call("builtins:print", '{"value": 1.0}', timeout_s=30.0) is None
        assert worker.call("builtins:abs", -3, timeout_s=30.0) == 3  # its own answer, not a stale one
        assert worker.restarts == 0  # nor was a printed line taken for a dead worker
    finally:
        worker.close()


@bounded(0.0, 1.0)
def runaway_check(response, task, tool_calls):
    return get_worker().call("time:sleep", 600, timeout_s=verifier_timeout_s())  # killed at the limit


@bounded(0.0, 1.0)
def quick_check(response, task, tool_calls):
    return RewardResult(float(get_worker().call("builtins:abs", -1, timeout_s=verifier_timeout_s())), True, True)


@pytest.mark.slow
async def test_a_check_queued_behind_a_runaway_one_is_not_cut_off_for_the_wait(monkeypatch):
    """The worker runs one check at a time: an honest episode's check waits for another episode's runaway
    one (then for the worker's restart). That wait is not its check's time: it was cut off at its gate's
    limit and a right answer scored the minimum, one episode's attack costing another its reward."""
    monkeypatch.setattr(rewards, "_BACKSTOP_S", 0.5)
    task = make_task("1?", "1")
    runaway = asyncio.create_task(RewardGate(runaway_check, timeout_s=2.5).score("x", task, {}))
    await asyncio.sleep(0.3)  # the runaway check holds the worker
    honest = await RewardGate(quick_check, timeout_s=0.5).score("1", task, {})
    assert (await runaway).error == "verifier_timeout"
    assert honest.error is None and honest.score == 1.0


@bounded(0.0, 1.0)
def unreadable_verdict(response, task, tool_calls):
    import numpy as np

    return 1.0, np.array([True, False])  # a finite score, but a `correct` no bool can be made of


async def test_a_reward_result_that_cannot_be_read_fails_its_episode_only_counted(tok):
    """A score that passes the gate with a verdict that cannot be read (bool() of it raises) escaped as a
    ValueError: through the endpoint it failed the whole group, other episodes' answers included."""
    group, _ = await agent_group(tok, answer_agent, unreadable_verdict, 2)
    assert len(group) == 2 and all(t.failed and t.reward == 0.0 for t in group)
    assert reward_error_counts(group.trajectories)["reward_errors/not_a_number"] == 2.0
    assert "unreadable_verdict" in group.trajectories[0].error


async def scored_with_a_list_of_parts(client, task):
    from agentenv.tasks.rewards import Scored

    await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    return Scored(1.0, True, parts=[1.0])  # type: ignore[arg-type]  # parts must be a mapping


async def test_an_environments_score_that_cannot_be_read_fails_its_episode_only(tok):
    group, _ = await agent_group(tok, scored_with_a_list_of_parts, get_reward("exact"), 2)
    assert len(group) == 2 and all(t.failed and t.reward == 0.0 and "scoring failed" in t.error for t in group)


_release = threading.Event()


@bounded(0.0, 1.0)
def hangs_in_its_thread(response, task, tool_calls):
    _release.wait(60)  # a user's reward that bounds none of its work (a regex that backtracks for ever)
    return 0.0


async def test_reward_functions_hung_in_their_threads_leave_the_loops_threads_free(monkeypatch):
    """The gate gives up on a reward function that bounds none of its work, but its thread runs on: in the loop's
    default executor, 40 of them took every thread, and the loop's other work waiting for a thread (the hf
    policy's decode steps, MCP closes) waited behind them."""
    monkeypatch.setattr(rewards, "_BACKSTOP_S", 0.1)
    gate = RewardGate(hangs_in_its_thread, timeout_s=0.1)
    try:
        results = await asyncio.gather(*(gate.score("x", make_task("1?", "1"), {}) for _ in range(40)))
        assert all(r.error == "verifier_timeout" for r in results)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5.0) == 42
    finally:
        _release.set()
