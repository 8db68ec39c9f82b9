"""ARPO's entropy-based adaptive rollout (arXiv 2507.19849, section 3.2) on the async engine.

One call of `TreeSampler.sample` grows the tree of one task:

1. N paths start as independent coroutines (`rollout.Episode`).
2. At every tool result of a running path, while branch slots remain, the path
   generates k tokens (a partial turn), H_t is their mean entropy and the rule
   in `branching.should_branch` decides (once per point, or once per fork:
   `fork_decision`). A tool result is a step whose info says
   `tool_result=True` (`AgentEnv` does for a tool's output, and not for its
   own messages: a malformed call's error, the tool-call limit, where there
   is nothing to explore but the answer). To branch, the env is forked Z times at
   the node right after the tool result (the k tokens are not stepped into the
   env yet, so the env still stands at that node) and every fork starts as its
   own coroutine, generating while other paths wait for their tools. The path
   itself continues its partial turn.
3. Branches stop when M - N slots are used; paths that end before that leave
   the rest to fresh independent trajectories. Never more than M.

Everything that decides is per call: H_initial belongs to each path of this
tree (a branch inherits its parent's, as it shares the first k tokens), so
nothing carries over between batches. Seeds derive from the call's seed and
each path's place in the tree: root path i (initial paths, then fills) gets
GRPO's episode seed `derive_seed(seed, i)`, so a tree that never probes (N = M)
is GRPO's group of M.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from agentenv.algorithms.arpo.branching import entropy_scale, fork_count, should_branch, window_entropy
from agentenv.algorithms.arpo.config import ARPOConfig
from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.engine import Episode, close_quietly, derive_seed, play_to_end
from agentenv.tasks.task import Task
from agentenv.types import Generation, Group, SamplingParams, Tokenizer, Trajectory

# seed streams of branches and branch decisions (3 or 4 parts: never a root's 2-part seed)
_BRANCH, _DECIDE = 3, 4


@dataclass
class _Path:
    """One running path of the tree."""

    episode: Episode
    role: str  # initial | branch | fill
    label: str  # place in the tree, e.g. "i3", "i3.t1.b0", "f0"
    h_initial: float | None = None
    tool_results: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)


class TreeSampler:
    """Grows a Group of M trajectories of one task as an entropy-guided tree.

    Args:
        cfg: ARPO's config (M, N, Z, α, β, τ, k, rule, normalization).
        rollout: Per-call and per-path limits of the rollout engine;
            `max_concurrency` bounds the paths in flight over every tree this
            sampler grows (a path waiting for a slot has not started its clock).
    """

    def __init__(self, cfg: ARPOConfig, rollout: RolloutConfig | None = None):
        self.cfg = cfg
        self.rollout = rollout or RolloutConfig()
        self._in_flight = asyncio.Semaphore(self.rollout.max_concurrency)

    async def sample(self, policy: Policy, make_env: MakeEnv, task: Task, params: SamplingParams, seed: int) -> Group:
        """The M trajectories of `task` (initial paths, branches, fills, in the order they started).

        `Group.info` holds `generated_tokens` (policy tokens actually
        generated, shared prefixes once, probe tokens included), `branch_points`,
        `branches`, `fills` and `decisions` (one record per probe).
        """
        return await _Tree(self.cfg, self.rollout, policy, make_env, task, params, seed, self._in_flight).grow()


class _Tree:
    """The state of one `sample` call; discarded when it returns."""

    def __init__(
        self,
        cfg: ARPOConfig,
        rollout: RolloutConfig,
        policy: Policy,
        make_env: MakeEnv,
        task: Task,
        params: SamplingParams,
        seed: int,
        in_flight: asyncio.Semaphore,
    ):
        self.cfg, self.rollout, self.policy, self.make_env = cfg, rollout, policy, make_env
        self.in_flight = in_flight  # shared by every tree of the sampler
        self.task, self.params, self.seed = task, params, int(seed)
        self.slots = cfg.branch_budget  # branch slots left: M - N at the start
        self.started = 0  # paths started (never above M)
        self.results: list[tuple[int, Trajectory]] = []  # (start order, trajectory)
        self.decisions: list[dict[str, Any]] = []
        self.branch_points = 0
        self.generated = 0  # tokens returned by every generate call of this tree
        self.pending: set[asyncio.Task[Any]] = set()
        self._scale: float | None = None

    # ---- the tree ------------------------------------------------------

    async def grow(self) -> Group:
        t0 = time.monotonic()
        try:
            N = self.cfg.initial_rollouts
            for i in range(N):
                self._start_root("initial", f"i{i}", derive_seed(self.seed, i))
            await self._drain()
            fills = self.cfg.group_size - self.started
            self.slots = 0  # fills take the rest; they never branch
            for j in range(fills):
                self._start_root("fill", f"f{j}", derive_seed(self.seed, N + j))
            await self._drain()
        finally:
            for t in self.pending:
                t.cancel()
            if self.pending:
                await asyncio.gather(*self.pending, return_exceptions=True)
        trajs = [t for _, t in sorted(self.results, key=lambda r: r[0])]
        group = Group(task=self.task, trajectories=trajs)
        group.info.update(
            seed=self.seed,
            failed=sum(t.failed for t in trajs),
            wall_s=time.monotonic() - t0,
            generated_tokens=self.generated,
            branch_points=self.branch_points,
            branches=sum(t.info.get("arpo", {}).get("role") == "branch" for t in trajs),
            fills=fills,
            decisions=self.decisions,
        )
        return group

    async def _drain(self) -> None:
        """Wait until no path runs (paths add their branches to `pending` while we wait)."""
        while self.pending:
            done, _ = await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)
            self.pending -= done
            for t in done:
                t.result()  # a path records its own failures; anything else is a bug and surfaces here

    def _spawn(self, path: _Path, fresh: bool) -> None:
        order = self.started
        self.started += 1
        task = asyncio.get_running_loop().create_task(self._run(path, order, fresh))
        self.pending.add(task)

    def _start_root(self, role: str, label: str, seed: int) -> None:
        try:
            env = self.make_env()
        except Exception as e:  # noqa: BLE001 - recorded, never raised (docs/reliability.md)
            self.results.append((self.started, _failed_root(self.task, role, label, seed, e)))
            self.started += 1
            return
        self._spawn(_Path(Episode(self.policy, env, self.params, seed, self.rollout), role, label), fresh=True)

    def _reserve(self, wanted: int) -> int:
        """Take up to `wanted` branch slots; 0 when the budget is spent."""
        n = min(wanted, self.slots)
        self.slots -= n
        return n

    # ---- one path ------------------------------------------------------

    async def _run(self, path: _Path, order: int, fresh: bool) -> None:
        """Play the path to its end within its own deadline; a failure becomes a failed trajectory."""
        try:
            async with self.in_flight:
                traj = await play_to_end(
                    path.episode, self.task, self.rollout.episode_timeout_s, fresh=fresh, play=lambda: self._play(path)
                )
        finally:
            # Also on a real cancellation: a session tool holds a live container process.
            error = await close_quietly(path.episode)
        if error:
            traj.info["close_error"] = error
        traj.info["arpo"] = {"role": path.role, "path": path.label, "h_initial": path.h_initial, "probes": path.probes}
        self.results.append((order, traj))

    async def _play(self, path: _Path) -> None:
        ep = path.episode
        partial: Generation | None = None
        while not ep.done:
            turn = await self._generate(ep, prefix=partial)
            if path.h_initial is None and turn.token_ids:
                path.h_initial = window_entropy(turn.entropies, self.cfg.entropy_window)
            partial = None
            step = await ep.step(turn)
            if step.done or not step.info.get("tool_result"):
                continue  # the end, or the env's own message: no tool result to branch after
            path.tool_results += 1
            if self.slots > 0 and path.h_initial is not None:
                partial = await self._probe(path)

    async def _probe(self, path: _Path) -> Generation:
        """At the node after a tool result: k tokens, ΔH, and maybe Z forks of the env before they are stepped."""
        ep = path.episode
        node = len(ep.env.context)
        probe = await self._generate(ep, max_tokens=self.cfg.entropy_window)
        if not probe.token_ids:
            return probe
        h_t = window_entropy(probe.entropies, self.cfg.entropy_window)
        cfg = self.cfg
        draws = fork_draws(cfg, ep.seed, path.tool_results)

        def branch(u: float) -> bool:
            return should_branch(
                h_t,
                path.h_initial,  # type: ignore[arg-type]  # set before any branch decision: checked by the caller
                alpha=cfg.alpha,
                beta=cfg.beta,
                tau=cfg.tau,
                rule=cfg.branch_rule,
                u=u,
                scale=self.scale(),
            )

        wanted = fork_count(cfg.forks_per_branch, cfg.fork_decision, draws, branch)
        n = self._reserve(wanted)
        record: dict[str, Any] = {
            "path": path.label,
            "tool_result": path.tool_results,
            "token": node,
            "h_initial": path.h_initial,
            "h_t": h_t,
            "delta_h": (h_t - path.h_initial) / self.scale(),  # type: ignore[operator]  # h_initial is set before any branch decision
            "branch": wanted > 0,
            "forks_wanted": wanted,
            "forks": n,
        }
        path.probes.append(record)
        self.decisions.append(record)
        for c in range(n):
            try:
                child = ep.fork(derive_seed(ep.seed, _BRANCH, path.tool_results, c))
            except Exception as e:  # noqa: BLE001 - the parent goes on; the slot goes back to the budget
                self.slots += 1
                record["forks"] -= 1
                record.setdefault("fork_errors", []).append(f"{type(e).__name__}: {e}")
                continue
            label = f"{path.label}.t{path.tool_results}.b{c}"
            self._spawn(_Path(child, "branch", label, h_initial=path.h_initial), fresh=False)
        if record["forks"]:
            self.branch_points += 1
        return probe

    async def _generate(self, ep: Episode, max_tokens: int | None = None, prefix: Generation | None = None) -> Generation:
        before = ep.generated_tokens
        gen = await ep.generate(max_tokens=max_tokens, prefix=prefix)
        self.generated += ep.generated_tokens - before
        if prefix is not None and len(gen.token_ids) > len(prefix.token_ids):
            gen = _cut_at_spanning_stop(gen, len(prefix.token_ids), ep.env.stop_strings, self.policy.tokenizer)
        return gen

    def scale(self) -> float:
        if self._scale is None:
            self._scale = entropy_scale(self.cfg.entropy_norm, len(self.policy.tokenizer))
        return self._scale


def fork_draws(cfg: ARPOConfig, seed: int, tool_result: int) -> list[float]:
    """The uniform draws of a path's branch point: one per point, or one per fork (fork c's own stream)."""
    keys = [()] if cfg.fork_decision == "per_point" else [(c,) for c in range(cfg.forks_per_branch)]
    return [random.Random(derive_seed(seed, _DECIDE, tool_result, *k)).random() for k in keys]


def _cut_at_spanning_stop(gen: Generation, boundary: int, stops: tuple[str, ...], tokenizer: Tokenizer) -> Generation:
    """End a continued turn at a stop string that began in its prefix.

    The policy checks stop strings only in what it generated, so one split by
    the probe boundary (`</pyt` + `hon>`) goes unseen and the turn runs on. The
    tokens kept are exactly those an unsplit turn would have ended with.
    """
    if not stops:
        return gen
    window = 4 * max(len(s) for s in stops) + 4  # tokens: a character is at most 4 byte-level tokens
    lo = max(0, boundary - window)
    for end in range(boundary + 1, min(len(gen.token_ids), boundary + window) + 1):
        text = tokenizer.decode(gen.token_ids[lo:end], skip_special_tokens=False)
        hit = next((s for s in stops if s in text), None)
        if hit is not None:
            if end == len(gen.token_ids):
                return gen
            return Generation(gen.token_ids[:end], gen.logprobs[:end], gen.entropies[:end], "stop", stop_string=hit,
                              versions=None if gen.versions is None else gen.versions[:end])
    return gen


def _failed_root(task: Task, role: str, label: str, seed: int, error: BaseException) -> Trajectory:
    return Trajectory(
        task_id=task.id,
        finish_reason="error",
        failed=True,
        error=f"make_env failed: {type(error).__name__}: {error}",
        info={"seed": seed, "arpo": {"role": role, "path": label, "h_initial": None, "probes": []}},
    )
