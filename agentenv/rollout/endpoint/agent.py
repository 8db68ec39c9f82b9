"""A user's agent as the rollout: `rollout.agent: package.module:attr`, run against the endpoint.

    async def agent(client: openai.AsyncOpenAI, task: agentenv.tasks.Task) -> str | float:
        ...   # any loop of client.chat.completions.create(...) calls, tools run by the agent itself
        return "the final answer"     # scored by env.reward against the task; or a float: the reward;
                                      # or a `Scored` (a reward with its parts, logged as rollout/reward_part/*)

Each episode opens its own key on the endpoint and gets a client with it. All
the requests it makes are recorded (`agentenv.rollout.endpoint.recorder`); its
trajectories share the episode's reward and name it (`Trajectory.episode`). A
group of a task is the trajectories of `n` episodes (an episode whose agent made
sub-calls gives several), and its statistics count episodes: each episode
weighs 1 in the group's baseline, however many requests it made
(`agentenv.algorithms.core.episode_rewards`). An
agent that raises or runs past `rollout.episode_timeout_s` fails its
episode's trajectories (masked from the loss); the group goes on.

Agent code cannot be forked at a branch point, so tree samplers (ARPO) cannot
train it: a run config with `rollout.agent` and such an algorithm is refused.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from agentenv._loops import gather_settled
from agentenv.envs.chat import ChatTemplate
from agentenv.envs.episode import MakeEnv
from agentenv.errors import ConfigError
from agentenv.policies.base import Policy
from agentenv.registry import load_import_path
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.engine import cancel_requested, derive_seed
from agentenv.tasks.rewards import DEFAULT_VERIFIER_TIMEOUT_S, RewardError, RewardGate, Scored, check_reward
from agentenv.tasks.task import Task
from agentenv.types import Group, SamplingParams, Trajectory

if TYPE_CHECKING:
    from agentenv.rollout.endpoint.server import Endpoint

TREE_REFUSAL = (
    "a user's agent (rollout.agent) is arbitrary code: it cannot be forked at a branch point, so an algorithm that "
    "grows trees (ARPO) cannot sample it; use an independent-sampler algorithm (grpo, dapo, rloo, reinforce_pp, "
    "gspo, dr_grpo)"
)


def load_agent(path: str, key: str = "rollout.agent") -> Any:
    """The agent function `path` names; ConfigError unless it is an async function of (client, task)."""
    fn = load_import_path(path, key, "agent")
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))):  # noqa: B004 - asks whether __call__ is async, not whether fn is callable
        raise ConfigError(key, f"{path!r} must be an async function (client, task) -> str | float, got {fn!r}")
    return fn


def _as_answer(text: str) -> str:
    """An agent's final answer as the policy text the built-in rewards read (inside `<answer>`)."""
    return text if "<answer>" in text else f"<answer>{text}</answer>"


def agent_http_client(endpoint: Endpoint) -> Any:
    """The httpx2 client the episodes' `openai` clients share: requests to the endpoint reach its handler in this
    process without a socket (`LocalTransport`; the clients' `base_url` is still the endpoint's HTTP URL, for
    anything an agent hands it to). An agent closing its client (`async with client:`) leaves it open;
    `close_pool` closes it."""
    import openai

    from agentenv.rollout.endpoint.server import LocalTransport

    class Shared(openai.DefaultAsyncHttpxClient):
        async def aclose(self) -> None:
            pass

        async def close_pool(self) -> None:
            await super().aclose()

    return Shared(transport=LocalTransport(endpoint))


class AgentRunner:
    """Runs a user's agent over the endpoint and turns its episodes into Groups.

    Args:
        agent: The agent function, or its `module:attr`.
        chat: The run's chat template (the env's: `env.chat_template`).
        reward_fn: `env.reward`, for agents that return their answer as a string.
        rollout: Timeouts, concurrency and the endpoint's settings.
        max_context_tokens: Most tokens of one trajectory.
        reward_timeout_s: Time limit of scoring one episode (`env.reward_timeout_s`).
    """

    def __init__(self, agent: Any, chat: ChatTemplate, reward_fn: Any, rollout: RolloutConfig | None = None,
                 max_context_tokens: int = 2048, reward_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S):  # fmt: skip
        from agentenv.rollout.endpoint.server import Endpoint

        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.reward_fn = reward_fn
        self.gate = RewardGate(reward_fn, reward_timeout_s)
        self.rollout = rollout or RolloutConfig()
        cfg: EndpointConfig = self.rollout.endpoint
        self.endpoint = Endpoint(chat, cfg, max_context_tokens, self.rollout.generation_limit_s)
        self._sem: asyncio.Semaphore | None = None
        self._http: Any = None
        self._seen: Counter[str] = Counter()  # endpoint counts already reported by `metrics`
        self._parts: dict[str, list[float]] = {}  # each reward part's values since the last `metrics`

    async def start(self) -> None:
        await self.endpoint.start()
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.rollout.max_concurrency)

    def client(self, key: str) -> Any:
        """An `openai.AsyncOpenAI` client of one episode (all share `agent_http_client`'s one httpx2 client)."""
        import openai

        if self._http is None:
            self._http = agent_http_client(self.endpoint)
        return openai.AsyncOpenAI(base_url=self.endpoint.url, api_key=key, max_retries=0, http_client=self._http,
                                  timeout=self.rollout.generation_limit_s)  # fmt: skip

    async def run_episode(self, policy: Policy, task: Task, params: SamplingParams, seed: int) -> list[Trajectory]:
        """One episode of the agent: its trajectories, scored (failed ones masked). Never raises for the agent's faults."""
        await self.start()
        assert self._sem is not None
        async with self._sem:
            rec = self.endpoint.open_episode(policy, params, seed)
            t0 = time.monotonic()
            error: str | None = None
            result: Any = None
            try:
                async with asyncio.timeout(self.rollout.episode_timeout_s):
                    result = await self.agent(self.client(rec.key), task)
                if isinstance(result, bool) or not isinstance(result, (str, int, float, Scored)):
                    error = f"the agent returned {type(result).__name__}; it must return a str (its answer) or a float (the reward)"
            except TimeoutError:
                error = f"TimeoutError: the agent ran past rollout.episode_timeout_s={self.rollout.episode_timeout_s:g} s"
            except asyncio.CancelledError:
                if cancel_requested():
                    self.endpoint.close_episode(rec.key)
                    raise
                error = "CancelledError raised inside the agent without a cancellation"
            except Exception as e:  # noqa: BLE001 - the agent's fault fails its episode, never the batch
                error = f"{type(e).__name__}: {e}"
            finally:
                self.endpoint.close_episode(rec.key)
            trajs = rec.trajectories(task.id)
            if error is None and not trajs:
                error = "the agent made no chat completion request"
            for t in trajs:
                t.info.update(t_start=t0, t_end=time.monotonic(), prefix_breaks=rec.prefix_breaks,
                              episode_trajectories=len(trajs))  # fmt: skip
            if error is not None:
                trajs = trajs or [Trajectory(task_id=task.id, episode=rec.uid, info={"seed": seed})]
                for t in trajs:
                    t.failed, t.error, t.finish_reason, t.reward = True, error, "error", 0.0
                return trajs
            try:
                score, info = await self._score(result, task, trajs)
            except RewardError as e:  # a NaN, an inf, a score out of range: this episode fails, counted; no other
                for t in trajs:
                    t.failed, t.error, t.finish_reason, t.reward = True, str(e), "error", 0.0
                    t.info["reward"] = {"score": 0.0, "correct": False, "format_ok": False, "error": e.kind}
                return trajs
            except Exception as e:  # noqa: BLE001 - scoring's own fault fails this episode, never the group
                for t in trajs:
                    t.failed, t.error, t.finish_reason, t.reward = True, f"scoring failed: {type(e).__name__}: {e}", "error", 0.0
                return trajs
            for t in trajs:
                t.reward = score
                t.info["reward"] = dict(info)
            return trajs

    async def _score(self, result: str | float | Scored, task: Task, trajs: list[Trajectory]) -> tuple[float, dict[str, Any]]:
        """The episode's reward through the gate: its answer scored by `env.reward`, its own float held to that
        reward's range, or an environment's own score (a verifiers rubric) and each of its parts held to be finite.
        A verifier that raises or runs past its limit scores the minimum; a bad number raises.

        Raises:
            RewardError: The score is no finite number in the reward's range.
        """
        if isinstance(result, Scored):
            unbounded = (-math.inf, math.inf)  # the environment's own reward: its range is its own
            parts = {name: check_reward(v, unbounded, f"the reward function {name!r}") for name, v in result.parts.items()}
            score = check_reward(result.score, unbounded, "the environment's reward")
            for name, value in parts.items():
                self._parts.setdefault(name, []).append(value)
            return score, {"score": score, "correct": result.correct, "format_ok": True, "parts": parts}
        if isinstance(result, str):
            calls: Counter[str] = Counter()
            for t in trajs:
                calls.update(t.tool_calls)
            r = await self.gate.score(_as_answer(result), task, dict(calls))
            info = {"score": r.score, "correct": r.correct, "format_ok": r.format_ok, "answer": result[:200]}
            return r.score, info if r.error is None else {**info, "error": r.error}
        score = self.gate.check(result, "the agent's returned reward")
        return score, {"score": score, "correct": score > 0, "format_ok": True}

    async def run_group(self, policy: Policy, task: Task, n: int, params: SamplingParams, seed: int) -> Group:
        """`n` episodes of `task`; episode i has seed `derive_seed(seed, i)`."""
        t0 = time.monotonic()
        eps = await gather_settled(*(self.run_episode(policy, task, params, derive_seed(seed, i)) for i in range(n)))
        trajs = [t for ep in eps for t in ep]
        return Group(task=task, trajectories=trajs, info={
            "seed": seed, "failed": sum(t.failed for t in trajs), "wall_s": time.monotonic() - t0, "episodes": n,
        })  # fmt: skip

    def sampler(self, n: int) -> AgentSampler:
        """A `Sampler` (the algorithm's group size `n`) that runs the agent."""
        return AgentSampler(self, n)

    def metrics(self) -> dict[str, float]:
        """Endpoint counts since the last call: `rollout/endpoint_requests`, `rollout/prefix_breaks`, `rollout/endpoint_errors`."""
        now = Counter(self.endpoint.counts)
        delta = now - self._seen
        self._seen = now
        parts, self._parts = self._parts, {}
        return {
            "rollout/endpoint_requests": float(delta["requests"]),
            "rollout/prefix_breaks": float(delta["prefix_breaks"]),
            "rollout/endpoint_errors": float(sum(v for k, v in delta.items() if k.startswith("error/"))),
            **{f"rollout/reward_part/{k}": sum(v) / len(v) for k, v in sorted(parts.items())},
        }

    async def aclose(self) -> None:
        await self.endpoint.aclose()
        if self._http is not None:
            http, self._http = self._http, None
            await http.close_pool()


class AgentSampler:
    """The `Sampler` of an independent-sampler algorithm when the rollout is a user's agent."""

    def __init__(self, runner: AgentRunner, n: int):
        self.runner = runner
        self.n = n

    async def sample(self, policy: Policy, make_env: MakeEnv, task: Task, params: SamplingParams, seed: int) -> Group:
        return await self.runner.run_group(policy, task, self.n, params, seed)
