"""ARPO's exploration at an equal tool-call budget, without training: the sampling and its records.

For each task one fixed policy spends the same tool-call budget B in several
arms, each its own sampler over its own budget:

- `grpo`: GRPO's sampler (`IndependentSampler`: independent trajectories);
- each tree in `ExploreConfig.trees`: ARPO's `TreeSampler` with the run's
  thresholds and the tree's overrides. The default trees are `arpo` (the
  run's rule), `arpo_random` (the stochastic rule with β = 0: it branches with
  probability τ at a probe whatever the entropy, so it has the tree's M, N, Z
  and probes and differs only in where it branches) and, when a threshold is
  given, `arpo_minority` (the threshold rule at a τ that only a minority of
  probes pass);
- `grpo_matched`: GRPO's trajectories plus extra final answers, each resampled
  from a finished GRPO trajectory's context right after its last paid tool
  result, at zero tool calls, until the arm has as many attempts as the
  `arpo` tree (`match_attempts`). The tree's forks made after the budget is
  spent answer again from contexts already paid for; this arm buys the same
  number of answers the same way, without the tree.

The budget is kept by the env, not by the sampler: every env of one (task,
arm) shares a `ToolBudget`, forks included. A call the budget still covers
runs and is counted; a call past it gets the env's refusal (like the
per-episode tool-call limit: no tool runs, "answer now", and a second refusal
ends the episode); an episode that would start after the budget is spent does
not start (left out: it never ran). Every arm runs at most `width` episodes at
once per task, so trajectories start in waves and a sampler that keeps
starting episodes spends the budget exactly. Root i gets `derive_seed(seed,
i)` in every arm, so the trees' N initial paths are GRPO's first N. The cap on
trajectories per task scales with B (`cap_per_call` x B), so no arm is shaped
by a cap the others never reach.

Every trajectory that ran becomes one `TrajRecord` (task, arm, budget, seed,
start order, parent and branch point, tool calls paid and refused, tokens
generated and prompt tokens re-read, the final answer, correct, the policy's
own score of it, the probes of a tree path). `agentenv.bench.explore_report`
computes every metric from these records alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv._loops import gather_settled
from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
from agentenv.algorithms.base import Sampler
from agentenv.algorithms.grpo import IndependentSampler
from agentenv.envs import AgentEnv
from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.engine import Episode, close_quietly, derive_seed, play_to_end
from agentenv.tasks.rewards import extract_boxed
from agentenv.tasks.task import Task
from agentenv.tools.base import Tool
from agentenv.types import Generation, Group, SamplingParams, Tokenizer, Trajectory

INDEPENDENT = "grpo"
MATCHED = "grpo_matched"
MAIN_TREE = "arpo"
BUDGET_SPENT = "BudgetSpent"
_EXTRA = 5  # seed stream of the matched arm's extra answers (never a root's, branch's or decision's)


class BudgetSpent(RuntimeError):
    """An episode would start after its task's tool budget was spent."""


@dataclass
class ToolBudget:
    """The tool calls one (task, arm) may make, shared by all its envs.

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
    """An AgentEnv whose real tool calls draw on a shared `ToolBudget` (its forks share it too).

    Each env also counts the calls it was granted (`paid`) and refused (`refused`) itself; a fork starts
    both at 0, so summed over a tree's trajectories they give the budget's totals, each call once.
    """

    def __init__(self, *args: Any, budget: ToolBudget, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.budget = budget
        self._budget_warned = False
        self.paid = 0
        self.refused = 0
        self.may_start_spent = False  # the matched arm's extra answers start on a spent budget

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self.budget.spent and not self.may_start_spent:
            raise BudgetSpent(f"the task's tool budget of {self.budget.total} calls is spent; the episode does not start")
        self._budget_warned = False
        self.paid = self.refused = 0
        return super().reset(seed=seed, options=options)

    async def _answer_call(self, parsed: Any, info: dict[str, Any]) -> str | None:
        used = sum(v for k, v in self._tool_calls.items() if k != "invalid")
        if parsed.kind != "malformed" and used < self.config.max_tool_calls:
            if not self.budget.take():
                self.refused += 1
                self._count("invalid")
                if self._budget_warned:
                    return None  # ends the episode, as the per-episode limit does
                self._budget_warned = True
                info.update(tool="invalid", tool_ok=False, tool_result=False)
                return (
                    f"Tool budget spent: this task's {self.budget.total} tool calls are used. "
                    "Do not call tools anymore; give your final answer now in <answer>...</answer>."
                )
            self.paid += 1
        return await super()._answer_call(parsed, info)

    def fork(self) -> BudgetedEnv:
        new = super().fork()
        assert isinstance(new, BudgetedEnv)
        new.paid = new.refused = 0  # the calls before the fork are the parent's
        return new

    def trajectory(self) -> Trajectory:
        traj = super().trajectory()
        traj.info["budget"] = {"paid": self.paid, "refused": self.refused}
        return traj


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


def default_trees(random_tau: float = 0.5, minority_tau: float | None = None) -> dict[str, dict[str, Any]]:
    """The trees every report compares: the run's rule, random branching, and (given its τ) a minority rule."""
    trees: dict[str, dict[str, Any]] = {
        MAIN_TREE: {},
        "arpo_random": {"branch_rule": "stochastic", "beta": 0.0, "tau": random_tau},
    }
    if minority_tau is not None:
        trees["arpo_minority"] = {"branch_rule": "threshold", "tau": minority_tau}
    return trees


@dataclass
class ExploreConfig:
    """The measurement's design.

    Attributes:
        budgets: The tool-call budgets B to measure.
        cap_per_call: Most trajectories per task and arm, per unit of budget: the cap is
            `max(width, cap_per_call * B)` (GRPO's G, ARPO's M), scaled with B so that a cap binds (if
            at all) at every budget alike.
        width: Episodes in flight per task and arm (ARPO's N initial paths; GRPO's waves).
        arpo: ARPO's settings besides `group_size`/`initial_rollouts` (its thresholds): α, β, τ, k, Z, rule.
        trees: Tree arms: name -> overrides of `arpo` (see `default_trees`).
        match_attempts: Add the `grpo_matched` arm (attempts matched to the `arpo` tree's).
        tasks_at_once: Tasks sampled concurrently (they share the policy's batches).
        seed: Base seed (see `explore`).
    """

    budgets: tuple[int, ...] = (4, 8)
    cap_per_call: int = 4
    width: int = 2
    arpo: dict[str, Any] = dataclasses.field(default_factory=dict)
    trees: dict[str, dict[str, Any]] = dataclasses.field(default_factory=default_trees)
    match_attempts: bool = True
    tasks_at_once: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        from agentenv.errors import ConfigError

        if not self.budgets or any(b < 1 for b in self.budgets):
            raise ConfigError("budgets", f"need budgets >= 1, got {list(self.budgets)}")
        if self.width < 1 or self.cap_per_call < 1:
            raise ConfigError("width", f"width and cap_per_call must be >= 1, got {self.width}, {self.cap_per_call}")
        if self.match_attempts and MAIN_TREE not in self.trees:
            raise ConfigError("trees", f"the matched arm matches the {MAIN_TREE!r} tree's attempts; trees has {list(self.trees)}")
        if INDEPENDENT in self.trees or MATCHED in self.trees:
            raise ConfigError("trees", f"{INDEPENDENT!r} and {MATCHED!r} are the independent arms, not tree names")
        for name in self.trees:
            self.arpo_config(name, self.budgets[0])  # a bad override fails here, naming the key

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm, in the order the report lists them."""
        return (INDEPENDENT, *((MATCHED,) if self.match_attempts else ()), *self.trees)

    def cap(self, budget: int) -> int:
        return max(self.width, self.cap_per_call * budget)

    def arpo_config(self, tree: str, budget: int) -> ARPOConfig:
        fields = {**self.arpo, **self.trees[tree], "group_size": self.cap(budget), "initial_rollouts": self.width}
        return ARPOConfig(**fields)

    def sampler(self, arm: str, budget: int) -> Sampler:
        """A fresh sampler (its own concurrency limit of `width`) for one task."""
        rollout = RolloutConfig(max_concurrency=self.width)
        if arm == INDEPENDENT:
            return IndependentSampler(self.cap(budget), rollout)
        if arm in self.trees:
            return TreeSampler(self.arpo_config(arm, budget), rollout)
        raise ValueError(f"unknown sampler arm {arm!r}; use one of {[INDEPENDENT, *self.trees]}")


@dataclass
class TrajRecord:
    """One trajectory that ran: the finest grain every explore metric is computed from.

    Attributes:
        task_id, kind, arm, budget: What was measured.
        seed: The task's seed (every arm's root i gets `derive_seed(seed, i)`).
        order: Start order within its (task, arm, budget).
        uid, parent: The trajectory's id and the one it branched off (None for a root).
        role: `root` (initial paths, GRPO's episodes), `branch`, `fill` (a tree's independent fills) or `extra`
            (the matched arm's resampled answer).
        branch_token: Where it left its parent's context (tokens); its prompt re-read that many tokens.
        paid: Tool calls the budget granted this trajectory itself (after its branch point).
        refused: Calls the budget refused it.
        gen_tokens: Tokens it generated itself (after its branch point; a tree path's probes included).
        reread_tokens: Context tokens it re-read as a prompt on starting from a parent's context (a fork's
            shared prefix, an extra answer's replayed context): 0 for a root.
        answer: The last `\\boxed{}` it wrote (None without one, or when it failed).
        correct: The task's reward called the episode solved.
        score: The policy's own score of its answer: the mean log-probability of its final turn's tokens.
        failed, finish: Whether it failed (infrastructure; never counted as an attempt) and why it ended.
        probes: A tree path's probes after tool results: [ΔH, the rule said branch] each (its forks may have
            found no slot left).
    """

    task_id: str
    kind: str
    arm: str
    budget: int
    seed: int
    order: int
    uid: str
    parent: str | None
    role: str
    branch_token: int
    paid: int
    refused: int
    gen_tokens: int
    reread_tokens: int
    answer: str | None
    correct: bool
    score: float | None
    failed: bool
    finish: str
    probes: list[list[Any]] = dataclasses.field(default_factory=list)

    @property
    def attempt(self) -> bool:
        """It ran to an end of its own (an answer or not): what pass@budget and the votes count."""
        return not self.failed


def final_answer(traj: Trajectory, tokenizer: Tokenizer) -> str | None:
    """The last `\\boxed{}` the policy wrote (None if none)."""
    text = "".join(tokenizer.decode(list(s.token_ids), skip_special_tokens=True) for s in traj.segments if s.source == "policy")
    ans = extract_boxed(text)
    return None if ans is None else " ".join(ans.split())


def final_turn_score(traj: Trajectory) -> float | None:
    """Mean log-probability of the last policy turn's tokens (the turn holding the answer); None without one."""
    turns = [s for s in traj.segments if s.source == "policy" and s.token_ids]
    if not turns:
        return None
    lps = [float(x) for x in (turns[-1].logprobs or []) if math.isfinite(float(x))]
    return sum(lps) / len(lps) if lps else None


def _role(traj: Trajectory) -> str:
    role = traj.info.get("arpo", {}).get("role") or traj.info.get("explore_role") or "root"
    return "root" if role == "initial" else str(role)


def records_of(group: Group, arm: str, budget: int, seed: int, tokenizer: Tokenizer, first: int = 0) -> list[TrajRecord]:
    """The `TrajRecord`s of a group's trajectories that ran (an episode refused at its start is left out)."""
    out = []
    kind = str(group.task.metadata.get("kind", group.task.ability))
    for i, t in enumerate(group.trajectories):
        if t.failed and BUDGET_SPENT in (t.error or ""):
            continue
        forked = t.parent_uid is not None and t.branch_token is not None
        probes = [[round(float(p["delta_h"]), 6), bool(p["branch"])] for p in t.info.get("arpo", {}).get("probes", [])]
        spent = t.info.get("budget", {})
        out.append(TrajRecord(
            task_id=group.task.id, kind=kind, arm=arm, budget=budget, seed=seed, order=first + i, uid=t.uid,
            parent=t.parent_uid, role=_role(t), branch_token=int(t.branch_token or 0) if forked else 0,
            paid=int(spent.get("paid", 0)), refused=int(spent.get("refused", 0)),
            gen_tokens=int(t.info.get("generated_tokens", 0)),
            reread_tokens=int(t.branch_token or 0) if forked else 0,
            answer=None if t.failed else final_answer(t, tokenizer), correct=bool(t.correct) and not t.failed,
            score=None if t.failed else final_turn_score(t), failed=bool(t.failed), finish=t.finish_reason,
            probes=probes,
        ))  # fmt: skip
    return out


# --------------------------------------------------------------------------- the matched arm's extra answers
def answer_node(traj: Trajectory) -> tuple[int, int]:
    """Where an extra answer of `traj` starts: (segments kept, tool calls paid in them).

    Right after the last tool result the budget paid for (a tree forks there too); the prompt alone
    when the trajectory paid for none.
    """
    calls = traj.info.get("calls", [])
    paid = [c for c in calls if c.get("tool") not in (None, "invalid")]
    if paid:
        return int(paid[-1]["segment"]) + 1, len(paid)
    first_turn = next((i for i, s in enumerate(traj.segments) if s.source == "policy"), len(traj.segments))
    return first_turn, 0


async def extra_answer(
    policy: Policy, make_env: Callable[[ToolBudget], MakeEnv], task: Task, source: Trajectory, params: SamplingParams,
    seed: int, rollout: RolloutConfig,
) -> Trajectory:  # fmt: skip
    """One more final answer from `source`'s context after its last paid tool result, at zero tool calls.

    A fresh env is reset with `source`'s seed and given `source`'s own turns up to that point, over a
    budget of exactly the calls those turns were paid (they re-run the same tools: nothing new is paid);
    the replayed context must equal `source`'s token for token, else the extra fails ("replay diverged").
    From there the policy writes with seed `seed`; a tool call now meets the spent budget and its refusal.
    """
    keep, paid = answer_node(source)
    prefix = [t for s in source.segments[:keep] for t in s.token_ids]
    budget = ToolBudget(paid)
    env = make_env(budget)()
    if not isinstance(env, BudgetedEnv):
        raise TypeError(f"the matched arm needs a BudgetedEnv, got {type(env).__name__}")
    env.may_start_spent = True
    ep = Episode(policy, env, params, seed, rollout)

    async def replay_then_answer() -> None:
        env.reset(seed=int(source.info.get("seed", seed)), options={"task": task})
        for s in source.segments[:keep]:
            if s.source == "policy":
                await env.astep(Generation(list(s.token_ids), list(s.logprobs or []), list(s.entropies or []), "stop"))
        if list(env.context) != prefix:
            raise RuntimeError(f"replay diverged: {len(env.context)} context tokens where the source has {len(prefix)}")
        await ep.run()

    try:
        traj = await play_to_end(ep, task, rollout.episode_timeout_s, fresh=False, play=replay_then_answer)
    finally:
        await close_quietly(ep)
    traj.parent_uid, traj.branch_token = source.uid, len(prefix)
    traj.info["explore_role"] = "extra"
    # The budget's total is the replayed calls: the extra itself is granted none (its calls are refused).
    traj.info["budget"] = {"paid": 0, "refused": env.refused}
    return traj


async def matched_extras(
    cfg: ExploreConfig, policy: Policy, env_for: Callable[[ToolBudget], MakeEnv], task: Task, grpo: Group,
    target: int, params: SamplingParams, seed: int,
) -> list[Trajectory]:  # fmt: skip
    """`target` minus GRPO's attempts extra answers, from its finished trajectories in turn (start order)."""
    finished = [t for t in grpo.trajectories if not t.failed]
    n = max(0, target - len(finished)) if finished else 0
    gate = asyncio.Semaphore(cfg.width)
    rollout = RolloutConfig(max_concurrency=cfg.width)

    async def one(e: int) -> Trajectory:
        async with gate:
            return await extra_answer(policy, env_for, task, finished[e % len(finished)], params,
                                      derive_seed(seed, _EXTRA, e), rollout)  # fmt: skip

    return await gather_settled(*(one(e) for e in range(n)))


# --------------------------------------------------------------------------- running it
EnvFor = Callable[[ToolBudget], MakeEnv]
"""The envs of one (task, arm): a factory over the shared budget (`budgeted_env_factory` bound to a run's env)."""


async def explore_task(
    cfg: ExploreConfig, B: int, policy: Policy, env_for: EnvFor, tokenizer: Tokenizer, task: Task,
    params: SamplingParams, seed: int,
) -> list[TrajRecord]:  # fmt: skip
    """Spend B tool calls on `task` in every arm (the samplers together, then the matched extras)."""
    samplers = [a for a in cfg.arms if a != MATCHED]

    async def run(arm: str) -> Group:
        return await cfg.sampler(arm, B).sample(policy, env_for(ToolBudget(B)), task, params, seed)

    groups = dict(zip(samplers, await gather_settled(*(run(a) for a in samplers))))
    out = [r for arm, g in groups.items() for r in records_of(g, arm, B, seed, tokenizer)]
    if cfg.match_attempts:
        base = records_of(groups[INDEPENDENT], MATCHED, B, seed, tokenizer)
        target = sum(r.attempt for r in out if r.arm == MAIN_TREE)
        extras = await matched_extras(cfg, policy, env_for, task, groups[INDEPENDENT], target, params, seed)
        more = records_of(Group(task=task, trajectories=extras), MATCHED, B, seed, tokenizer, first=len(base))
        out += base + more
    return out


async def explore(
    cfg: ExploreConfig, policy: Policy, env_for: EnvFor, tokenizer: Tokenizer, tasks: Sequence[Task],
    params: SamplingParams, progress: Callable[[str], None] | None = None, *,
    done: Container[tuple[int, str]] = frozenset(), on_chunk: Callable[[list[TrajRecord]], None] | None = None,
) -> list[TrajRecord]:  # fmt: skip
    """Every (budget, task, arm), `tasks_at_once` tasks at a time (each at every budget, every arm, together).

    Task i gets the seed `cfg.seed * 1_000_003 + i` in every arm and at every budget. A chunk of tasks is
    measured at every budget before the next starts, so a run stopped midway holds every budget on the same
    tasks (paired across budgets as well).

    Args:
        done: (budget, task id) pairs measured already (a resumed run): skipped; the other tasks keep their
            seeds (i is the index in `tasks`), so a resumed run measures what an uninterrupted one would.
        on_chunk: Called with each chunk's records as soon as it finishes (to write them as they come).
    """
    out: list[TrajRecord] = []
    todo = [(i, t) for i, t in enumerate(tasks) if any((B, t.id) not in done for B in cfg.budgets)]
    for lo in range(0, len(todo), cfg.tasks_at_once):
        chunk = todo[lo : lo + cfg.tasks_at_once]
        jobs = [
            explore_task(cfg, B, policy, env_for, tokenizer, t, params, cfg.seed * 1_000_003 + i)
            for i, t in chunk
            for B in cfg.budgets
            if (B, t.id) not in done
        ]
        got = [r for rs in await gather_settled(*jobs) for r in rs]
        out += got
        if on_chunk:
            on_chunk(got)
        if progress:
            progress(f"{len(tasks) - len(todo) + lo + len(chunk)}/{len(tasks)} tasks, budgets {list(cfg.budgets)}")
    return out
