"""The rollout engine against a round-synchronous loop, side by side in one process.

Two ways to roll out the same groups (same policy, tasks, tools, sampling seeds):

- engine: the samplers the trainer runs (`agentenv.rollout` under GRPO's
  `IndependentSampler` and ARPO's `TreeSampler`), every task's group at once;
  each trajectory is a coroutine, so no trajectory waits for another's tool.
- rounds: written for this comparison, the loop ARPO's published code runs:
  every active trajectory generates a turn, then all tools run, then the next
  turn starts (a round ends with its slowest call). For ARPO trees the probe
  (k tokens after a tool result), the branching rule and the forks happen at
  the start of the next round, in path order; fills start when a tree's paths
  are done. Both loops build on the same `Episode` (same per-call seeds).

Tool latency (injected on top of the tool's own time): lognormal, median
`m`, σ = 1.0 (mean 1.65 m, p90 3.6 m, p99 10 m, capped at 30 m), as real
search APIs and sandboxes show (most calls fast, a few slow). A call's latency
is drawn from a generator seeded by (latency seed, episode seed, fork lineage,
call index): the same call waits the same under both loops. (ARPO trees: the
branch slots go to the first paths to reach a tool result, so the two loops
may grow differently shaped trees; the table counts the tool calls each made,
a branch's calls before its branch point once.)

Policies:
- scripted: turns written in advance (c tool calls, then an answer) served by a
  simulated continuous-batching engine: every decode step takes `--step-ms`
  and advances each in-flight request by one token. It isolates the engine's
  structure (no model noise); c sweeps 1, 3, 6, 10.
- tiny: the embedded model on the hf backend (which batches concurrent
  calls), the toy tasks; it decides its own calls.

Policy idle: wall time with no `generate` call in flight.

    python benchmarks/rollout.py [--part scripted,episodes,tiny,real] [--step-ms 10] [--tasks 8]

Parts: `scripted` (calls × latency × GRPO/ARPO, 8 tasks × 8 trajectories),
`episodes` (6 calls, median 0.2 s: 1 to 32 tasks), `tiny` (the tiny model,
the local BM25 retriever, injected latency), `real` (real tools, nothing
injected: the Docker python sandbox and the BM25 retriever, scripted and tiny).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
from agentenv.algorithms.arpo.branching import entropy_scale, fork_count, should_branch, window_entropy
from agentenv.algorithms.arpo.sampler import _BRANCH, _cut_at_spanning_stop, fork_draws
from agentenv.algorithms.grpo import IndependentSampler
from agentenv.envs.agent_env import AgentEnv
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import Episode, RolloutConfig, derive_seed
from agentenv.types import Generation, Group, SamplingParams, Trajectory

SIGMA = 1.0
CAP = 30.0  # × the median


# --------------------------------------------------------------------------- latency
@dataclass(frozen=True)
class Latency:
    """Lognormal tool latency with median `median_s` (0: none), keyed by the call."""

    median_s: float
    seed: int = 0

    def draw(self, key: tuple[int, ...]) -> float:
        if self.median_s <= 0:
            return 0.0
        rng = np.random.default_rng(derive_seed(self.seed, *key))
        return float(min(rng.lognormal(math.log(self.median_s), SIGMA), CAP * self.median_s))


class LatentEnv(AgentEnv):
    """An AgentEnv whose tool calls first wait their drawn latency.

    The key of a call: the episode seed, the fork lineage (for each fork: the
    node and the parent's fork count), the call's index in the trajectory.
    """

    latency: Latency = Latency(0.0)
    made: list[int] = [0]  # tool calls actually made, over every env (a branch's inherited calls not again)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        out = super().reset(seed=seed, options=options)
        self._lineage: tuple[int, ...] = (int(seed or 0),)
        self._calls_made = 0
        self._forks = 0
        return out

    def fork(self) -> LatentEnv:
        new = super().fork()
        self._forks += 1
        new._lineage = self._lineage + (len(self._context), self._forks)
        new._forks = 0
        return new

    async def _answer_call(self, parsed: Any, info: dict[str, Any]) -> str | None:
        if parsed.kind == "call":
            LatentEnv.made[0] += 1
            delay = self.latency.draw(self._lineage + (self._calls_made,))
            self._calls_made += 1
            if delay > 0:
                await asyncio.sleep(delay)
        return await super()._answer_call(parsed, info)


def latent_factory(tools: list[Any], tokenizer: Any, reward_fn: Any, config: Any, latency: Latency):
    def make_env() -> LatentEnv:
        env = LatentEnv(tools, tokenizer, reward_fn=reward_fn, config=config)
        env.latency = latency
        return env

    return make_env


# --------------------------------------------------------------------------- policies
class SimServer:
    """A scripted policy behind a simulated continuous-batching engine.

    Each decode step takes `step_s` and gives one token to every in-flight
    request (prefill is free); a request returns when all its tokens are out.
    """

    def __init__(self, inner: ScriptedPolicy, step_s: float):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.step_s = step_s
        self._queue: list[list[Any]] = []  # [tokens left, future]
        self._ticker: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        gen = await self.inner.generate(prompt_ids, params)
        if not gen.token_ids:
            return gen
        fut = asyncio.get_running_loop().create_future()
        self._queue.append([len(gen.token_ids), fut])
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        await fut
        return gen

    async def _tick(self) -> None:
        while self._queue:
            await asyncio.sleep(self.step_s)
            for item in self._queue:
                item[0] -= 1
            for item in [i for i in self._queue if i[0] <= 0]:
                if not item[1].done():  # a caller that was cancelled (a timeout, a closed run) waits no more
                    item[1].set_result(None)
            self._queue = [i for i in self._queue if i[0] > 0]

    def load_weights(self, named_tensors: Any) -> None:
        pass


class Meter:
    """Wraps a policy: time with no `generate` call in flight (the policy idle)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.in_flight = 0
        self.idle_s = 0.0
        self._idle_since = time.perf_counter()

    def start(self) -> None:
        self.in_flight, self.idle_s, self._idle_since = 0, 0.0, time.perf_counter()

    def stop(self) -> float:
        if self.in_flight == 0:
            self.idle_s += time.perf_counter() - self._idle_since
        return self.idle_s

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.in_flight == 0:
            self.idle_s += time.perf_counter() - self._idle_since
        self.in_flight += 1
        try:
            return await self.inner.generate(prompt_ids, params)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle_since = time.perf_counter()

    def load_weights(self, named_tensors: Any) -> None:
        self.inner.load_weights(named_tensors)


def scripted_turns(calls: int, tool: str = "search") -> list[str]:
    queries = {"search": "capital of france population {i}", "python": "print({i} * 7)"}[tool]
    return [f"<{tool}>{queries.format(i=i)}</{tool}>" for i in range(calls)] + ["<answer>\\boxed{42}</answer>"]


# --------------------------------------------------------------------------- the two loops
async def engine_groups(algo: str, cfg: Any, policy: Any, make_env: Any, tasks: list, params: SamplingParams,
                        seeds: list[int], rollout: RolloutConfig) -> list[Group]:  # fmt: skip
    """The trainer's way: one sampler, every task's group at once."""
    sampler = IndependentSampler(cfg, rollout) if algo == "grpo" else TreeSampler(cfg, rollout)
    return list(await asyncio.gather(*(sampler.sample(policy, make_env, t, params, s) for t, s in zip(tasks, seeds))))


async def rounds_grpo(n: int, policy: Any, make_env: Any, tasks: list, params: SamplingParams,
                      seeds: list[int], rollout: RolloutConfig) -> list[Group]:  # fmt: skip
    """Round-synchronous: every active episode generates a turn, then every tool runs."""
    eps = [[Episode(policy, make_env(), params, derive_seed(s, i), rollout) for i in range(n)] for s in seeds]
    for task, group in zip(tasks, eps):
        for ep in group:
            ep.reset(task)
    active = [ep for g in eps for ep in g]
    while active:
        gens = await asyncio.gather(*(ep.generate() for ep in active))
        await asyncio.gather(*(ep.step(g) for ep, g in zip(active, gens)))
        active = [ep for ep in active if not ep.done]
    groups = [Group(task=t, trajectories=[ep.trajectory() for ep in g]) for t, g in zip(tasks, eps)]
    for g in eps:
        for ep in g:
            await ep.aclose()
    return groups


@dataclass
class _RPath:
    episode: Episode
    h_initial: float | None = None
    tool_results: int = 0
    fresh: bool = False  # a tool result arrived in the last round
    partial: Generation | None = None


@dataclass
class _RTree:
    task: Any
    seed: int
    slots: int
    paths: list[_RPath] = field(default_factory=list)
    done: list[_RPath] = field(default_factory=list)
    filled: bool = False


async def rounds_arpo(cfg: ARPOConfig, policy: Any, make_env: Any, tasks: list, params: SamplingParams,
                      seeds: list[int], rollout: RolloutConfig) -> list[Group]:  # fmt: skip
    """Round-synchronous ARPO: probe and branch at the start of a round, then every path's turn, then every tool."""
    scale = entropy_scale(cfg.entropy_norm, len(policy.tokenizer))
    trees = [_RTree(t, s, cfg.branch_budget) for t, s in zip(tasks, seeds)]

    def root(tree: _RTree, seed: int) -> None:
        ep = Episode(policy, make_env(), params, seed, rollout)
        ep.reset(tree.task)
        tree.paths.append(_RPath(ep))

    for tree in trees:
        for i in range(cfg.initial_rollouts):
            root(tree, derive_seed(tree.seed, i))  # the sampler's root seeds (GRPO's)
    while any(tree.paths for tree in trees):
        # 1. probes: k tokens after each fresh tool result, while the tree has slots
        probing = [(tree, p) for tree in trees for p in tree.paths if p.fresh and tree.slots > 0 and p.h_initial is not None]
        probes = await asyncio.gather(*(p.episode.generate(max_tokens=cfg.entropy_window) for _, p in probing))
        for (tree, p), probe in zip(probing, probes):
            p.partial = probe
            if not probe.token_ids:
                continue
            h_t = window_entropy(probe.entropies, cfg.entropy_window)
            draws = fork_draws(cfg, p.episode.seed, p.tool_results)
            wanted = fork_count(cfg.forks_per_branch, cfg.fork_decision, draws, lambda u, p=p, h_t=h_t: should_branch(
                h_t, p.h_initial, alpha=cfg.alpha, beta=cfg.beta, tau=cfg.tau, rule=cfg.branch_rule, u=u, scale=scale))
            n = min(wanted, tree.slots)
            tree.slots -= n
            for c in range(n):
                child = p.episode.fork(derive_seed(p.episode.seed, _BRANCH, p.tool_results, c))
                tree.paths.append(_RPath(child, h_initial=p.h_initial))
        # 2. every path's turn (a probed path continues its partial turn)
        active = [p for tree in trees for p in tree.paths]
        turns = await asyncio.gather(*(p.episode.generate(prefix=p.partial) for p in active))
        for p, turn in zip(active, turns):
            if p.partial is not None and len(turn.token_ids) > len(p.partial.token_ids):
                turn = _cut_at_spanning_stop(turn, len(p.partial.token_ids), p.episode.env.stop_strings, policy.tokenizer)
            if p.h_initial is None and turn.token_ids:
                p.h_initial = window_entropy(turn.entropies, cfg.entropy_window)
            p.partial = turn
        # 3. every tool
        steps = await asyncio.gather(*(p.episode.step(p.partial) for p in active))
        for p, step in zip(active, steps):
            p.partial = None
            p.fresh = not step.done and bool(step.info.get("tool_result"))  # a tool's result, not the env's message
            p.tool_results += p.fresh
        for tree in trees:
            tree.done += [p for p in tree.paths if p.episode.done]
            tree.paths = [p for p in tree.paths if not p.episode.done]
            if not tree.paths and not tree.filled:
                tree.filled = True
                tree.slots = 0
                for j in range(cfg.group_size - len(tree.done)):
                    root(tree, derive_seed(tree.seed, cfg.initial_rollouts + j))
    groups = []
    for tree in trees:
        groups.append(Group(task=tree.task, trajectories=[p.episode.trajectory() for p in tree.done]))
        for p in tree.done:
            await p.episode.aclose()
    return groups


# --------------------------------------------------------------------------- measuring
@dataclass
class Result:
    wall_s: float
    idle_s: float
    trajectories: int
    tool_calls: int
    failed: int


async def measure(loop_name: str, algo: str, cfg: Any, policy: Meter, make_env: Any, tasks: list,
                  params: SamplingParams, seed: int) -> Result:  # fmt: skip
    rollout = RolloutConfig(episode_timeout_s=3600.0, generation_timeout_s=3600.0, max_concurrency=4096)
    seeds = [derive_seed(seed, j) for j in range(len(tasks))]
    policy.start()
    made = LatentEnv.made[0]
    t0 = time.perf_counter()
    if loop_name == "engine":
        groups = await engine_groups(algo, cfg, policy, make_env, tasks, params, seeds, rollout)
    elif algo == "grpo":
        groups = await rounds_grpo(cfg, policy, make_env, tasks, params, seeds, rollout)
    else:
        groups = await rounds_arpo(cfg, policy, make_env, tasks, params, seeds, rollout)
    wall = time.perf_counter() - t0
    trajs: list[Trajectory] = [t for g in groups for t in g]
    return Result(wall, policy.stop(), len(trajs), LatentEnv.made[0] - made, sum(t.failed for t in trajs))


HEAD = ("| policy | tools | algo | tasks × group | calls/ep | latency median | loop | wall s | traj/s | "
        "policy idle s (%) | tool calls | failed | engine speed-up |")  # fmt: skip


def rows_for(label: dict[str, str], engine: Result, rounds: Result) -> list[str]:
    out = []
    for name, r in (("engine", engine), ("rounds", rounds)):
        speed = f"**{rounds.wall_s / engine.wall_s:.2f}x**" if name == "engine" else ""
        out.append(
            f"| {label['policy']} | {label['tools']} | {label['algo']} | {label['size']} | {label['calls']} | "
            f"{label['latency']} | {name} | {r.wall_s:.2f} | {r.trajectories / r.wall_s:.1f} | "
            f"{r.idle_s:.2f} ({r.idle_s / r.wall_s:.0%}) | {r.tool_calls} | {r.failed} | {speed} |"
        )
    return out


async def compare(label: dict[str, str], algo: str, cfg: Any, policy: Meter, make_env: Any, tasks: list,
                  params: SamplingParams, seed: int) -> list[str]:  # fmt: skip
    engine = await measure("engine", algo, cfg, policy, make_env, tasks, params, seed)
    rounds = await measure("rounds", algo, cfg, policy, make_env, tasks, params, seed)
    lines = rows_for(label, engine, rounds)
    for line in lines:
        print(line, flush=True)
    return lines


def algo_cfg(algo: str, group: int, window: int) -> Any:
    if algo == "grpo":
        return group
    # α = 0.6 > τ: with the scripted policy's zero entropies every probe branches while slots remain
    return ARPOConfig(group_size=group, initial_rollouts=group // 2, forks_per_branch=2, entropy_window=window,
                      alpha=0.6, beta=0.2, tau=0.5)  # fmt: skip


# --------------------------------------------------------------------------- parts
def scripted_world(tool: str, real_tools: dict[str, Any] | None = None):
    from agentenv.envs.testing import EchoTool, boxed_reward, build_test_tokenizer, make_task

    tok = build_test_tokenizer()
    tools = list(real_tools.values()) if real_tools else [EchoTool("search"), EchoTool("python")]
    tasks = [make_task(task_id=f"t{j}") for j in range(64)]
    config = {"max_tool_calls": 12, "max_context_tokens": 4096, "max_result_tokens": 128}
    return tok, tools, boxed_reward, config, tasks


async def part_scripted(args: Any, out: list[str], calls_list: list[int], medians: list[float], tasks_n: int,
                        real_tools: dict[str, Any] | None = None, tool: str = "search", label_tools: str = "echo") -> None:  # fmt: skip
    tok, tools, reward, config, tasks = scripted_world(tool, real_tools)
    params = SamplingParams(max_tokens=64, temperature=1.0)
    if real_tools:  # warm-up, untimed: the sandbox pool starts its containers on first use
        warm = Meter(SimServer(ScriptedPolicy(tok, scripted_turns(1, tool)), args.step_ms / 1000))
        make_env = latent_factory(tools, tok, reward, config, Latency(0.0))
        await measure("engine", "grpo", 8, warm, make_env, tasks[:tasks_n], params, args.seed + 1)
    for calls in calls_list:
        base = ScriptedPolicy(tok, scripted_turns(calls, tool))
        policy = Meter(SimServer(base, args.step_ms / 1000))
        for median in medians:
            make_env = latent_factory(tools, tok, reward, config, Latency(median, seed=args.seed))
            for algo in ("grpo", "arpo"):
                label = {"policy": f"scripted ({args.step_ms:g} ms/token)", "tools": label_tools, "algo": algo,
                         "size": f"{tasks_n} × 8", "calls": str(calls), "latency": f"{median:g} s"}  # fmt: skip
                out += await compare(label, algo, algo_cfg(algo, 8, 4), policy, make_env, tasks[:tasks_n], params, args.seed)


async def part_tiny(args: Any, out: list[str], tools_names: list[str], medians: list[float], kinds: list[str]) -> None:
    from agentenv.configs import load_config
    from agentenv.training.build import build_runtime

    overrides = ["policy.backend=hf", f"env.tools=[{','.join(tools_names)}]", f"env.tasks.kinds=[{','.join(kinds)}]"]
    cfg = load_config("configs/toy_arpo.yaml", overrides)
    rt = build_runtime(cfg)
    try:
        policy = Meter(rt.policy)
        params = cfg.policy.sampling_params()
        tasks = rt.tasks.train[: args.tasks]
        # warm-up: the first generate calls pay for allocation
        await engine_groups("grpo", 2, policy, rt.make_env, tasks[:2], params, [1, 2], RolloutConfig())
        for median in medians:
            make_env = latent_factory(list(rt.tools.values()), rt.tokenizer, cfg.env.reward_fn(), cfg.env,
                                      Latency(median, seed=args.seed))  # fmt: skip
            for algo in ("grpo", "arpo"):
                acfg = cfg.algorithm_config if algo == "arpo" else 8
                label = {"policy": "tiny (hf)", "tools": "+".join(tools_names), "algo": algo, "size": f"{len(tasks)} × 8",
                         "calls": "model", "latency": f"{median:g} s" if median else "0 (real only)"}  # fmt: skip
                out += await compare(label, algo, acfg, policy, make_env, tasks, params, args.seed)
    finally:
        await rt.aclose()


async def main_async(args: Any) -> None:
    out: list[str] = []
    parts = args.part.split(",")
    print(HEAD)
    print("|" + "---|" * 7 + "---:|" * 6)
    if "scripted" in parts:
        await part_scripted(args, out, [1, 3, 6, 10], [0.0, 0.05, 0.2], args.tasks)
    if "episodes" in parts:
        for n in (1, 4, 16, 32):
            await part_scripted(args, out, [6], [0.2], n)
    if "tiny" in parts:
        await part_tiny(args, out, ["search"], [0.0, 0.2], ["twohop"])
    if "real" in parts:
        from agentenv.configs import load_config
        from agentenv.training.build import build_tools

        cfg = load_config("configs/toy_arpo.yaml")
        tools = build_tools(cfg.env)  # the Docker python sandbox (pool of 4) and the BM25 retriever
        try:
            await part_scripted(args, out, [3, 6], [0.0], args.tasks, {"python": tools["python"]}, "python", "python (Docker)")
            await part_scripted(args, out, [3, 6], [0.0], args.tasks, {"search": tools["search"]}, "search", "search (BM25)")
        finally:
            for t in tools.values():
                await t.aclose()
        await part_tiny(args, out, ["search", "python"], [0.0], ["arith", "twohop", "both"])
    print("\n" + HEAD)
    print("|" + "---|" * 7 + "---:|" * 6)
    print("\n".join(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="scripted,episodes,tiny,real")
    ap.add_argument("--step-ms", type=float, default=10.0, help="scripted: one decode step of the simulated engine")
    ap.add_argument("--tasks", type=int, default=8, help="tasks (groups of 8) per comparison")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
