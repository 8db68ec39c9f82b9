"""The equal-tool-budget measurement: the env keeps the budget, both samplers spend exactly B; the paired table."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.bench.explore import (
    BudgetedEnv,
    ExploreConfig,
    Outcome,
    ToolBudget,
    explore,
    markdown,
    paired_rows,
)
from agentenv.envs.testing import EchoTool, boxed_reward, build_test_tokenizer, make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.types import SamplingParams

TOK = build_test_tokenizer()
TURNS = ["<search>first</search>", "<search>second</search>", "<answer>\\boxed{42}</answer>"]


TOOLS: dict[int, EchoTool] = {}  # id(budget) -> the tool its envs call (EchoTool.fork is itself: one call list)


def env_for(budget: ToolBudget):
    tool = TOOLS[id(budget)] = EchoTool("search")
    config = {"max_context_tokens": 2048, "max_result_tokens": 64, "max_tool_calls": 5}
    return lambda: BudgetedEnv([tool], TOK, reward_fn=boxed_reward, config=config, budget=budget)


@pytest.mark.parametrize("B", [1, 5, 8])
def test_both_samplers_spend_exactly_b_tool_calls_counted_by_the_env(B):
    """Every trajectory searches twice, then answers. ARPO's probes all branch (α = 1 > τ), so its tree forks;
    GRPO starts waves of 2 independent episodes. The env grants B calls and refuses the rest, in both."""
    cfg = ExploreConfig(budgets=(B,), max_trajectories=8, width=2, arpo={"alpha": 1.0, "beta": 0.0}, tasks_at_once=3)
    tasks = [make_task(task_id=f"t{i}") for i in range(3)]
    policy = ScriptedPolicy(TOK, TURNS)
    budgets: list[ToolBudget] = []
    outs = asyncio.run(explore(cfg, policy, lambda b: (budgets.append(b), env_for(b))[1], TOK, tasks,
                               SamplingParams(max_tokens=64)))  # fmt: skip
    assert len(outs) == 2 * len(tasks) == len(budgets)
    assert all(len(TOOLS[id(b)].calls) == B for b in budgets)  # the tool ran exactly B times per (task, sampler)
    for o in outs:
        assert o.tool_calls == B, o  # the env's count
        if B % 2:  # an odd budget ends inside an episode's two searches: its second is refused
            assert o.refused >= 1
        assert o.failed == 0 and 1 <= o.correct <= o.trajectories  # one refused twice ends without an answer
        assert o.passed == 1.0 and o.answers == 1
    arpo = [o for o in outs if o.sampler == "arpo"]
    grpo = [o for o in outs if o.sampler == "grpo"]
    assert all(o.branches == 0 for o in grpo)
    if B >= 2:
        assert all(o.branches > 0 for o in arpo)  # the tree did branch within the budget
    # GRPO: 2 searches per episode; the episodes that would start after the budget is spent never run
    assert all(-(-B // 2) <= o.trajectories <= min(8, B + 1) for o in grpo)


def test_an_episode_after_the_budget_does_not_start_and_a_call_past_it_is_refused():
    budget = ToolBudget(1)
    env = env_for(budget)()
    env.reset(options={"task": make_task()})
    enc = lambda s: TOK.encode(s, add_special_tokens=False)  # noqa: E731
    _, _, done, _, info = env.step(enc("<search>a</search>"))
    assert info["tool_result"] and budget.used == 1 and not done
    fork = env.fork()
    _, _, _, _, info = fork.step(enc("<search>b</search>"))  # a fork draws on the same budget
    assert not info["tool_result"] and budget.used == 1 and budget.refused == 1
    assert "Tool budget spent" in TOK.decode(list(fork.context))
    with pytest.raises(Exception, match="tool budget of 1 calls is spent"):
        env_for(budget)().reset(options={"task": make_task()})


def _o(sampler: str, task: str, correct: int, calls: int = 4, answers: int = 1) -> Outcome:
    return Outcome(task, sampler, 4, calls, 0, 3, 0, correct, answers, 100, 0)


def test_paired_rows_difference_by_task():
    outs = [_o("grpo", "a", 0), _o("arpo", "a", 1), _o("grpo", "b", 1), _o("arpo", "b", 2),
            _o("grpo", "c", 0), _o("arpo", "c", 0, answers=3)]  # fmt: skip
    rows = {r.metric: r for r in paired_rows(outs)}
    p = rows["pass@budget"]
    assert p.grpo.mean == pytest.approx(1 / 3) and p.arpo.mean == pytest.approx(2 / 3)
    assert p.diff.mean == pytest.approx(1 / 3) and p.diff.n == 3
    assert rows["correct/tool call"].diff.mean == pytest.approx((0.25 + 0.25 + 0) / 3)
    assert rows["distinct answers"].diff.mean == pytest.approx(2 / 3)
    md = markdown(list(rows.values()), 3)
    assert "| 4 | pass@budget | 0.333 [" in md


def test_an_env_class_the_budget_cannot_keep_is_refused_by_name():
    """The budget lives in AgentEnv's tool calls: another `env.class` would be measured as AgentEnv in silence."""
    import dataclasses

    from agentenv.bench.explore import budgeted_env_factory
    from agentenv.envs.config import AgentEnvConfig
    from agentenv.errors import ConfigError

    cfg = dataclasses.replace(AgentEnvConfig(), env_class="openenv", options={"url": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError, match=r"env\.class.*openenv"):
        budgeted_env_factory(cfg, {"search": EchoTool("search")}, TOK, ToolBudget(4))
    make = budgeted_env_factory(AgentEnvConfig(), {"search": EchoTool("search")}, TOK, ToolBudget(4))
    assert isinstance(make(), BudgetedEnv)


def test_a_resumed_run_skips_what_is_done_and_keeps_every_task_s_seed(monkeypatch):
    """`done` (budget, task) pairs are not sampled again; the others get the seed an uninterrupted run gives them
    (their index in the task list); a chunk of tasks runs at every budget it lacks, and its outcomes reach
    `on_chunk` as it finishes."""
    import agentenv.bench.explore as explore_mod

    seeds: list[tuple[int, str, str, int]] = []
    real = explore_mod.explore_task

    async def spy(cfg, name, B, policy, env_for_, tokenizer, task, params, seed):
        seeds.append((B, task.id, name, seed))
        return await real(cfg, name, B, policy, env_for_, tokenizer, task, params, seed)

    monkeypatch.setattr(explore_mod, "explore_task", spy)
    cfg = ExploreConfig(budgets=(2, 4), max_trajectories=4, width=2, tasks_at_once=2, seed=1)
    tasks = [make_task(task_id=f"t{i}") for i in range(4)]
    chunks: list[list[Outcome]] = []
    outs = asyncio.run(explore(cfg, ScriptedPolicy(TOK, TURNS), env_for, TOK, tasks, SamplingParams(max_tokens=64),
                               done={(2, "t0"), (2, "t2"), (4, "t1")}, on_chunk=chunks.append))  # fmt: skip
    todo = [(2, "t1"), (2, "t3"), (4, "t0"), (4, "t2"), (4, "t3")]
    assert sorted((o.budget, o.task_id) for o in outs if o.sampler == "grpo") == todo
    assert sorted((B, t, s, seed) for B, t, s, seed in seeds) == sorted(
        (B, t, s, 1_000_003 + int(t[1:])) for B, t in todo for s in ("grpo", "arpo")
    )
    assert [len(c) for c in chunks] == [4, 6]  # t0 at 4, t1 at 2; then t2 at 4, t3 at 2 and 4 (x 2 samplers)
    assert [o for c in chunks for o in c] == outs
