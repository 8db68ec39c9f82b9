"""The async rollout engine: policies against AgentEnvs, one coroutine per episode.

Each episode is a coroutine (generate, step the env, generate again), so a slow
tool call of one episode never holds up another's generation, and there is no
round barrier. Each episode has its own deadline (`episode_timeout_s`); a
failing episode (exception, timeout, a stray `CancelledError` from a tool or
the policy) is recorded as a failed trajectory and never aborts its group. Only
a real cancellation of the caller propagates.

Samplers beyond independent ones (ARPO's tree) build on `Episode`: generate a
turn with a custom `max_tokens`, continue a partial turn, `fork()` at a branch
point, and `concat_generations` to join the pieces of one turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from agentenv._loops import gather_settled
from agentenv.envs.episode import AnyEnv, EpisodeEnv, MakeEnv, StepResult
from agentenv.errors import InfraError
from agentenv.policies.base import Policy
from agentenv.policies.routing import ROUTE_KEY
from agentenv.rollout.config import RolloutConfig
from agentenv.tasks.rewards import RewardError, check_reward
from agentenv.tasks.task import Task
from agentenv.types import Generation, Group, SamplingParams, Trajectory


def cancel_requested() -> bool:
    """Whether the running task is being cancelled, as opposed to a `CancelledError` that a
    tool or library raised on its own (which must fail one trajectory, not the whole batch)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (episode seed, turn index, ...); same parts, same seed."""
    words = [int(p) % (1 << 64) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> np.uint64(1))


def concat_generations(*gens: Generation) -> Generation:
    """Join the pieces of one turn (a partial turn and its continuation).

    The result's `finish_reason` and `stop_string` are those of the last piece;
    its `versions` are the pieces' joined, or None when a piece has none.
    """
    if not gens:
        raise ValueError("concat_generations needs at least one Generation")
    versioned = all(g.versions is not None for g in gens)
    return Generation(
        token_ids=[t for g in gens for t in g.token_ids],
        logprobs=[x for g in gens for x in g.logprobs],
        entropies=[x for g in gens for x in g.entropies],
        finish_reason=gens[-1].finish_reason,
        stop_string=gens[-1].stop_string,
        versions=[v for g in gens for v in (g.versions or [])] if versioned else None,
    )


def _unwrap(env: AnyEnv) -> EpisodeEnv:
    """The env itself, or under gymnasium wrappers the base env (wrappers are sync-only)."""
    if isinstance(env, EpisodeEnv):
        return env
    inner = env.unwrapped if isinstance(env, gymnasium.Env) else None
    if isinstance(inner, EpisodeEnv):
        return inner
    raise TypeError(
        f"the rollout needs an env with the EpisodeEnv members (astep, fork, ...: an AgentEnv), got {type(env).__name__}"
    )


class Episode:
    """One episode driven turn by turn; the building block of samplers.

    Per-call seeds are derived from the episode seed and the index of the
    `generate` call, so the same seed and the same sequence of calls give the
    same trajectory.

    Args:
        policy: A `Policy`.
        env: An `AgentEnv` (gymnasium wrappers are looked through).
        params: Base sampling parameters; `stop`, `max_tokens` and `seed` are set per call.
        seed: Episode seed (reset seed and source of the per-call seeds).
        config: Rollout limits.

    Attributes:
        gen_time_s: Wall time this Episode object waited for the policy.
        generated_tokens: Tokens this Episode object generated (a fork starts
            at 0, so summing over a tree counts shared prefixes once).
    """

    def __init__(
        self, policy: Policy, env: AnyEnv, params: SamplingParams, seed: int, config: RolloutConfig | None = None
    ):
        self.policy = policy
        self.env = _unwrap(env)
        self.params = params
        self.seed = int(seed)
        self.config = config or RolloutConfig()
        self.gen_time_s = 0.0
        self.generated_tokens = 0
        self.turns = 0
        self._calls = 0
        self.route_key = uuid.uuid4().hex
        """Sent with each `generate` (`agentenv.policies.routing`): a distributed policy keeps the trajectory on one engine."""

    @property
    def done(self) -> bool:
        return bool(self.env.done)

    def reset(self, task: Task) -> list[int]:
        """Reset the env on `task` with the episode seed; returns the prompt ids."""
        obs, _ = self.env.reset(seed=self.seed, options={"task": task})
        return [int(t) for t in obs]

    async def areset(self, task: Task) -> list[int]:
        """`reset` on the event loop (an env that starts with a round trip, such as a remote server's reset)."""
        obs, _ = await self.env.areset(seed=self.seed, options={"task": task})
        return [int(t) for t in obs]

    def turn_cap(self) -> int:
        """Most tokens of one turn (the base params')."""
        return self.params.max_tokens

    async def generate(self, max_tokens: int | None = None, prefix: Generation | None = None) -> Generation:
        """Generate (part of) a turn from the current context.

        Args:
            max_tokens: Most new tokens; default: the turn cap minus the
                prefix. Always within the env's remaining context.
            prefix: A partial turn to continue (its tokens are appended to the
                prompt, not to the env); the result is prefix + continuation.
                A prefix that already finished (`stop`/`eos`) is returned as is.

        Returns:
            The turn (or its first part when `max_tokens` cut it: finish `length`).

        Raises:
            InfraError: The policy timed out.
        """
        done = prefix.token_ids if prefix is not None else []
        if prefix is not None and prefix.finish_reason != "length":
            return prefix
        cap = max_tokens if max_tokens is not None else self.turn_cap() - len(done)
        budget = min(cap, self.env.remaining_tokens - len(done))
        if budget < 1:
            empty = Generation([], [], [], "length", versions=[])  # no token: joins a versioned prefix
            return concat_generations(prefix, empty) if prefix is not None else empty
        params = dataclasses.replace(
            self.params,
            max_tokens=budget,
            stop=tuple(self.env.stop_strings),
            seed=derive_seed(self.seed, self._calls),
        )
        self._calls += 1
        prompt = self.env.context + list(done)
        t0 = time.perf_counter()
        limit = self.config.generation_limit_s
        token = ROUTE_KEY.set(self.route_key)  # wait_for's task copies the context, key included
        try:
            gen = await asyncio.wait_for(self.policy.generate(prompt, params), limit)
        except TimeoutError as e:
            raise InfraError(
                f"policy.generate timed out after {limit:g} s "
                f"(prompt {len(prompt)} tokens); raise rollout.generation_timeout_s or check the policy backend"
            ) from e
        finally:
            ROUTE_KEY.reset(token)
            self.gen_time_s += time.perf_counter() - t0
        if not isinstance(gen, Generation):
            raise TypeError(f"policy.generate returned {type(gen).__name__}, expected agentenv.types.Generation")
        self.generated_tokens += len(gen.token_ids)
        return concat_generations(prefix, gen) if prefix is not None else gen

    async def step(self, generation: Generation) -> StepResult:
        """Give a (complete) turn to the env; its step, named (an env of the user's may return a plain 5-tuple)."""
        obs, reward, terminated, truncated, info = await self.env.astep(generation)
        self.turns += 1
        return StepResult(np.asarray(obs), float(reward), bool(terminated), bool(truncated), info)

    async def play_turn(self, max_tokens: int | None = None) -> StepResult:
        """Generate one turn and step the env with it."""
        return await self.step(await self.generate(max_tokens))

    async def run(self) -> None:
        """Play turns until the episode ends."""
        while not self.done:
            await self.play_turn()

    def fork(self, seed: int) -> Episode:
        """A branch: the env forked (context, counters, tools), a new seed for what follows."""
        new = Episode(self.policy, self.env.fork(), self.params, seed, self.config)
        new.turns = self.turns
        new.route_key = self.route_key  # its prefix is the parent's: same engine, prefix-cache hits
        return new

    def trajectory(self) -> Trajectory:
        """The env's trajectory with this Episode's generation time and token count."""
        traj = self.env.trajectory()
        traj.gen_time_s = self.gen_time_s
        traj.info["generated_tokens"] = self.generated_tokens
        traj.info["seed"] = self.seed
        if not traj.failed:  # an env class of the user's builds its own trajectory: its reward passes the gate here
            try:
                check_reward(traj.reward, (-math.inf, math.inf), f"{type(self.env).__name__}'s reward")
            except RewardError as e:
                traj.failed, traj.error, traj.finish_reason, traj.reward = True, str(e), "error", 0.0
                traj.info["reward"] = {"score": 0.0, "correct": False, "format_ok": False, "error": e.kind}
        return traj

    def failed_trajectory(self, task: Task, error: BaseException | str) -> Trajectory:
        """The trajectory so far, marked failed with the error's message."""
        try:
            traj = self.trajectory()
        except Exception:  # noqa: BLE001 - the env may be broken; record what we can
            traj = Trajectory(task_id=task.id, info={"seed": self.seed})
        traj.task_id = task.id
        traj.failed = True
        traj.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        traj.finish_reason = "error"
        traj.reward = 0.0
        return traj

    async def aclose(self) -> None:
        """Close the episode's tools (the env's prototypes stay open)."""
        await self.env.aclose()


async def play_to_end(
    ep: Episode, task: Task, timeout_s: float | None, *, fresh: bool, play: Callable[[], Any] | None = None
) -> Trajectory:
    """Play an episode to its end within its own deadline; every failure becomes a failed trajectory.

    Args:
        ep: The episode.
        task: Its task (reset on it when `fresh`).
        timeout_s: The episode's deadline; None for none.
        fresh: Reset the env first (False for a fork that continues).
        play: The coroutine function that plays the turns (default `ep.run`;
            a tree sampler passes its own).

    Returns:
        The trajectory; failed (masked from the loss) on an exception, on the
        deadline, or on a `CancelledError` that was no cancellation of this task.

    Raises:
        asyncio.CancelledError: Only when this task itself is being cancelled.
    """
    try:
        async with asyncio.timeout(timeout_s):
            if fresh:
                await ep.areset(task)
            await (play or ep.run)()
        return ep.trajectory()
    except TimeoutError as e:
        # asyncio.timeout's error has no message; others keep theirs.
        return ep.failed_trajectory(task, e if str(e) else f"TimeoutError: episode timed out after {timeout_s:g} s")
    except Exception as e:  # noqa: BLE001 - recorded, never raised (docs/reliability.md: a slow or broken trajectory costs only itself)
        return ep.failed_trajectory(task, e)
    except asyncio.CancelledError:
        if cancel_requested():
            raise
        why = "CancelledError raised inside the episode (by a tool or the policy) without a cancellation"
        return ep.failed_trajectory(task, why)


async def close_quietly(ep: Episode) -> str | None:
    """Close an episode's tools; the error's message when closing failed.

    The close runs to its end (each tool's close is bounded by the tool
    timeout) even when the caller is cancelled meanwhile; the cancellation is
    raised after it.
    """
    closing = asyncio.ensure_future(ep.aclose())
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await asyncio.wait([closing])
        if not closing.cancelled():
            closing.exception()  # retrieved: the cancellation is what the caller sees
        raise
    except Exception as e:  # noqa: BLE001 - a close error is logged on the trajectory
        return f"{type(e).__name__}: {e}"
    return None


def failed_group(task: Task, n: int, error: BaseException | str, info: dict[str, Any] | None = None) -> Group:
    """A group of `n` failed trajectories, for a sampler that raised instead of returning its group."""
    msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    trajs = [Trajectory(task_id=task.id, finish_reason="error", failed=True, error=msg) for _ in range(n)]
    return Group(task=task, trajectories=trajs, info={**(info or {}), "failed": n, "error": msg})


class RolloutEngine:
    """Runs episodes and groups for one policy under one concurrency limit.

    Args:
        policy: A `Policy`.
        config: Rollout limits.
    """

    def __init__(self, policy: Policy, config: RolloutConfig | None = None):
        self.policy = policy
        self.config = config or RolloutConfig()
        self._sem = asyncio.Semaphore(self.config.max_concurrency)

    async def run_episode(self, env: AnyEnv, task: Task, params: SamplingParams, seed: int) -> Trajectory:
        """Roll out one episode to its end. Never raises for a failing episode.

        Returns:
            The trajectory; on any exception or timeout `failed=True`,
            `finish_reason="error"` and `error` holds the message. The
            episode's tools are closed in every case.
        """
        async with self._sem:
            ep = Episode(self.policy, env, params, seed, self.config)
            t0 = time.monotonic()
            try:
                traj = await play_to_end(ep, task, self.config.episode_timeout_s, fresh=True)
            finally:
                # Also on a real cancellation: a session tool holds a live container process.
                close_error = await close_quietly(ep)
            if close_error:
                traj.info["close_error"] = close_error
            traj.info["t_start"] = t0
            traj.info["t_end"] = time.monotonic()
            return traj

    async def run_group(
        self, make_env: MakeEnv, task: Task, n: int, params: SamplingParams, seed: int
    ) -> Group:
        """Roll out `n` independent episodes of `task` concurrently.

        Episode i gets seed `derive_seed(seed, i)` and its own env from `make_env()`.
        """
        if n < 1:
            raise ValueError(f"run_group needs n >= 1, got {n}")
        t0 = time.monotonic()

        async def one(i: int) -> Trajectory:
            ep_seed = derive_seed(seed, i)
            try:
                env = make_env()
            except Exception as e:  # noqa: BLE001 - a broken factory fails this episode, not the group
                return Trajectory(
                    task_id=task.id, finish_reason="error", failed=True,
                    error=f"make_env failed: {type(e).__name__}: {e}", info={"seed": ep_seed},
                )  # fmt: skip
            return await self.run_episode(env, task, params, ep_seed)

        trajs = await gather_settled(*(one(i) for i in range(n)))
        return Group(
            task=task,
            trajectories=list(trajs),
            info={"seed": seed, "failed": sum(t.failed for t in trajs), "wall_s": time.monotonic() - t0},
        )


async def run_episode(
    policy: Policy,
    env: AnyEnv,
    task: Task,
    params: SamplingParams,
    seed: int,
    config: RolloutConfig | None = None,
) -> Trajectory:
    """Roll out one episode (see `RolloutEngine.run_episode`)."""
    return await RolloutEngine(policy, config).run_episode(env, task, params, seed)


async def run_group(
    policy: Policy,
    make_env: MakeEnv,
    task: Task,
    n: int,
    params: SamplingParams,
    seed: int,
    config: RolloutConfig | None = None,
) -> Group:
    """Roll out a group of `n` episodes concurrently (see `RolloutEngine.run_group`)."""
    return await RolloutEngine(policy, config).run_group(make_env, task, n, params, seed)
