"""ARPO's exploration at an equal tool-call budget, without training.

For each task one fixed policy spends the same tool-call budget B two ways:
GRPO's sampler (`IndependentSampler`: independent trajectories) and ARPO's
(`TreeSampler`: the entropy-branching tree, with its thresholds). The budget is
kept by the env, not by the sampler: every env of one (task, sampler) shares a
`ToolBudget`, forks included. A call the budget still covers runs and is
counted; a call past it gets the env's refusal (like the per-episode
tool-call limit: no tool runs, no tool result, "answer now"); an episode that
would start after the budget is spent does not start (its env refuses the
reset and the sampler records it as failed with `BudgetSpent`; those are left
out: they never ran). Both samplers run at most `width` episodes at once
(`rollout.max_concurrency`, per task), so trajectories start in waves and a
sampler that keeps starting episodes spends the budget exactly (when the model
calls tools at all). Their seeds are the samplers' own: root i gets
`derive_seed(seed, i)` in both, so ARPO's N initial paths are GRPO's first N.

Per task and sampler (`Outcome`): pass@budget (a correct trajectory), distinct
final answers (the last `\\boxed{}` each trajectory wrote), correct
trajectories per tool call, tool calls the env granted, generated tokens (a
tree's shared prefixes once, its probes included). `paired_rows` turns the
outcomes into the table: each sampler's mean, and ARPO minus GRPO paired by
task, with Student t intervals over tasks (`agentenv.bench.stats`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
from agentenv.algorithms.base import Sampler, generated_tokens
from agentenv.algorithms.grpo import IndependentSampler
from agentenv.bench.stats import Interval, t_interval
from agentenv.envs import AgentEnv
from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.tasks.rewards import extract_boxed
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.types import Group, SamplingParams, Tokenizer, Trajectory

SAMPLERS = ("grpo", "arpo")
BUDGET_SPENT = "BudgetSpent"


class BudgetSpent(RuntimeError):
    """An episode would start after its task's tool budget was spent."""


@dataclass
class ToolBudget:
    """The tool calls one (task, sampler) may make, shared by all its envs.

    Attributes:
        total: B.
        used: Calls granted so far (never above `total`).
        refused: Calls refused because the budget was spent.
    """

    total: int
    used: int = 0
    refused: int = 0

    @property
    def spent(self) -> bool:
        return self.used >= self.total

    def take(self) -> bool:
        """Grant one call if the budget covers it."""
        if self.spent:
            self.refused += 1
            return False
        self.used += 1
        return True


class BudgetedEnv(AgentEnv):
    """An AgentEnv whose real tool calls draw on a shared `ToolBudget` (its forks share it too)."""

    def __init__(self, *args: Any, budget: ToolBudget, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.budget = budget
        self._budget_warned = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self.budget.spent:
            raise BudgetSpent(f"the task's tool budget of {self.budget.total} calls is spent; the episode does not start")
        self._budget_warned = False
        return super().reset(seed=seed, options=options)

    async def _answer_call(self, parsed: Any, info: dict[str, Any]) -> str | None:
        used = sum(v for k, v in self._tool_calls.items() if k != "invalid")
        if parsed.kind != "malformed" and used < self.config.max_tool_calls and not self.budget.take():
            self._count("invalid")
            if self._budget_warned:
                return None  # ends the episode, as the per-episode limit does
            self._budget_warned = True
            info.update(tool="invalid", tool_ok=False, tool_result=False)
            return (
                f"Tool budget spent: this task's {self.budget.total} tool calls are used. "
                "Do not call tools anymore; give your final answer now in <answer>...</answer>."
            )
        return await super()._answer_call(parsed, info)


def budgeted_env_factory(env_cfg: Any, tools: dict[str, Tool], tokenizer: Tokenizer, budget: ToolBudget) -> MakeEnv:
    """As `training.build.make_env_factory`, over one shared budget.

    Raises:
        ConfigError: `env.class` is not `agent`: the budget is kept in AgentEnv's tool calls, and another
            class measured as AgentEnv would be a different env than the run's.
    """
    from agentenv.errors import ConfigError

    spec = env_cfg.env_spec()
    if spec.cls is not AgentEnv:
        raise ConfigError("env.class", f"the tool budget is kept by AgentEnv ('agent'); {spec.name!r} cannot be measured")
    reward_fn = env_cfg.reward_fn()
    prototypes = list(tools.values())
    return lambda: BudgetedEnv(prototypes, tokenizer, reward_fn=reward_fn, config=env_cfg, budget=budget)


@dataclass
class ExploreConfig:
    """The measurement's design.

    Attributes:
        budgets: The tool-call budgets B to measure.
        max_trajectories: Most trajectories per task and sampler (GRPO's G, ARPO's M); large enough that
            the budget, not this cap, ends sampling.
        width: Episodes in flight per task and sampler (ARPO's N initial paths; GRPO's waves).
        arpo: ARPO's settings besides `group_size`/`initial_rollouts` (its thresholds): α, β, τ, k, Z, rule.
        tasks_at_once: Tasks sampled concurrently (they share the policy's batches).
        seed: Base seed (see `explore`).
    """

    budgets: tuple[int, ...] = (4, 8)
    max_trajectories: int = 16
    width: int = 2
    arpo: dict[str, Any] = dataclasses.field(default_factory=dict)
    tasks_at_once: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        from agentenv.errors import ConfigError

        if not self.budgets or any(b < 1 for b in self.budgets):
            raise ConfigError("budgets", f"need budgets >= 1, got {list(self.budgets)}")
        if not 1 <= self.width <= self.max_trajectories:
            raise ConfigError("width", f"must be in 1..max_trajectories ({self.max_trajectories}), got {self.width}")

    def arpo_config(self) -> ARPOConfig:
        return ARPOConfig(**{**self.arpo, "group_size": self.max_trajectories, "initial_rollouts": self.width})

    def sampler(self, name: str) -> Sampler:
        """A fresh sampler (its own concurrency limit of `width`) for one task."""
        rollout = RolloutConfig(max_concurrency=self.width)
        if name == "grpo":
            return IndependentSampler(self.max_trajectories, rollout)
        if name == "arpo":
            return TreeSampler(self.arpo_config(), rollout)
        raise ValueError(f"unknown sampler {name!r}; use one of {SAMPLERS}")


@dataclass
class Outcome:
    """One task, one sampler, one budget."""

    task_id: str
    sampler: str
    budget: int
    tool_calls: int  # granted by the env (ToolBudget.used)
    refused: int  # calls the env refused once the budget was spent
    trajectories: int  # episodes that ran (not the ones refused at the start)
    failed: int  # episodes that ran and failed
    correct: int
    answers: int  # distinct final answers
    gen_tokens: int
    branches: int

    @property
    def passed(self) -> float:
        return float(self.correct > 0)

    @property
    def correct_per_call(self) -> float:
        return self.correct / self.tool_calls if self.tool_calls else 0.0


def final_answer(traj: Trajectory, tokenizer: Tokenizer) -> str | None:
    """The last `\\boxed{}` the policy wrote (None if none)."""
    text = "".join(tokenizer.decode(list(s.token_ids), skip_special_tokens=True) for s in traj.segments if s.source == "policy")
    ans = extract_boxed(text)
    return None if ans is None else " ".join(ans.split())


def outcome(group: Group, name: str, budget: ToolBudget, tokenizer: Tokenizer) -> Outcome:
    ran = [t for t in group.trajectories if not (t.failed and BUDGET_SPENT in (t.error or ""))]
    ok = [t for t in ran if not t.failed]
    answers = {a for a in (final_answer(t, tokenizer) for t in ok) if a is not None}
    tokens = group.info.get("generated_tokens")
    return Outcome(
        task_id=group.task.id,
        sampler=name,
        budget=budget.total,
        tool_calls=budget.used,
        refused=budget.refused,
        trajectories=len(ran),
        failed=len(ran) - len(ok),
        correct=sum(bool(t.correct) for t in ok),
        answers=len(answers),
        gen_tokens=int(tokens) if tokens is not None else sum(generated_tokens(t) for t in ran),
        branches=sum(t.info.get("arpo", {}).get("role") == "branch" for t in ran),
    )


# the envs of one (task, sampler): a factory over the shared budget (`budgeted_env_factory` bound to a run's env)
EnvFor = Callable[[ToolBudget], MakeEnv]


async def explore_task(
    cfg: ExploreConfig, name: str, B: int, policy: Policy, env_for: EnvFor, tokenizer: Tokenizer, task: Task,
    params: SamplingParams, seed: int,
) -> Outcome:  # fmt: skip
    """Spend B tool calls on `task` with sampler `name`; the env counts them."""
    budget = ToolBudget(B)
    group = await cfg.sampler(name).sample(policy, env_for(budget), task, params, seed)
    return outcome(group, name, budget, tokenizer)


async def explore(
    cfg: ExploreConfig, policy: Policy, env_for: EnvFor, tokenizer: Tokenizer, tasks: Sequence[Task],
    params: SamplingParams, progress: Callable[[str], None] | None = None, *,
    done: Container[tuple[int, str]] = frozenset(), on_chunk: Callable[[list[Outcome]], None] | None = None,
) -> list[Outcome]:  # fmt: skip
    """Every (budget, task, sampler), `tasks_at_once` tasks at a time (each at every budget, both samplers, together).

    Task i gets the seed `cfg.seed * 1_000_003 + i` under both samplers and every budget. A chunk of tasks is
    measured at every budget before the next starts, so a run stopped midway holds every budget on the same
    tasks (paired across budgets as well).

    Args:
        done: (budget, task id) pairs measured already (a resumed run): skipped; the other tasks keep their
            seeds (i is the index in `tasks`), so a resumed run measures what an uninterrupted one would.
        on_chunk: Called with each chunk's outcomes as soon as it finishes (to write them as they come).
    """
    out: list[Outcome] = []
    todo = [(i, t) for i, t in enumerate(tasks) if any((B, t.id) not in done for B in cfg.budgets)]
    for lo in range(0, len(todo), cfg.tasks_at_once):
        chunk = todo[lo : lo + cfg.tasks_at_once]
        jobs = [
            explore_task(cfg, name, B, policy, env_for, tokenizer, t, params, cfg.seed * 1_000_003 + i)
            for i, t in chunk
            for B in cfg.budgets
            if (B, t.id) not in done
            for name in SAMPLERS
        ]
        got = await asyncio.gather(*jobs)
        out += got
        if on_chunk:
            on_chunk(got)
        if progress:
            progress(f"{len(tasks) - len(todo) + lo + len(chunk)}/{len(tasks)} tasks, budgets {list(cfg.budgets)}")
    return out


# --------------------------------------------------------------------------- the table
COLUMNS = (
    ("pass@budget", lambda o: o.passed),
    ("distinct answers", lambda o: float(o.answers)),
    ("correct/tool call", lambda o: o.correct_per_call),
    ("tool calls", lambda o: float(o.tool_calls)),
    ("gen tokens", lambda o: float(o.gen_tokens)),
    ("trajectories", lambda o: float(o.trajectories)),
)


@dataclass
class Row:
    budget: int
    metric: str
    grpo: Interval
    arpo: Interval
    diff: Interval  # arpo - grpo, paired by task


def paired_rows(outcomes: Sequence[Outcome], confidence: float = 0.95) -> list[Row]:
    """Per budget and metric: each sampler's mean over tasks and ARPO - GRPO paired by task, with t intervals."""
    rows = []
    for B in sorted({o.budget for o in outcomes}):
        by = {(o.sampler, o.task_id): o for o in outcomes if o.budget == B}
        ids = sorted({tid for s, tid in by if s == "grpo"} & {tid for s, tid in by if s == "arpo"})
        for metric, f in COLUMNS:
            g = [f(by["grpo", i]) for i in ids]
            a = [f(by["arpo", i]) for i in ids]
            rows.append(Row(B, metric, t_interval(g, confidence), t_interval(a, confidence),
                            t_interval([y - x for x, y in zip(g, a)], confidence)))  # fmt: skip
    return rows


def _iv(iv: Interval, signed: bool = False) -> str:
    if iv.n == 0:
        return "n/a"
    f = "{:+.3f}" if signed else "{:.3f}"
    if iv.n < 2 or not math.isfinite(iv.low):
        return f.format(iv.mean)
    mark = " *" if signed and iv.excludes(0.0) else ""
    return f"{f.format(iv.mean)} [{iv.low:.3f}, {iv.high:.3f}]{mark}"


def markdown(rows: Sequence[Row], n_tasks: int) -> str:
    lines = [
        f"| B | metric | GRPO sampler (mean [95% CI], {n_tasks} tasks) | ARPO tree | ARPO - GRPO, paired by task |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.budget} | {r.metric} | {_iv(r.grpo)} | {_iv(r.arpo)} | {_iv(r.diff, signed=True)} |")
    return "\n".join(lines)
