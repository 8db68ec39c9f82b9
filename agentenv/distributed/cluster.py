"""Joining the Ray cluster and starting a run's actors from `rollout.ray`.

Every trainer process runs the same code. Rank 0 starts the actors, named in
the run's namespace (or finds them, when another program started them); the
other ranks wait for them by name. Ray ends an actor with the process that
made it, so only rank 0 makes them: a rank that finishes first (rank 0 alone
evaluates) takes nothing down. Rank 0, if it made them (the first to claim the
`WeightStore`), ends them at close, and it pushes the weights.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray

from agentenv.distributed.client import STORES, RayPolicy
from agentenv.distributed.tools import RemoteTool, ToolService
from agentenv.distributed.worker import RolloutWorker, WeightStore
from agentenv.errors import InfraError
from agentenv.policies.base import Policy
from agentenv.rollout.config import RayRolloutConfig
from agentenv.types import Tokenizer

_TOKEN = uuid.uuid4().hex  # this process, for the store's claim


def connect(cfg: RayRolloutConfig) -> bool:
    """Join `cfg.address` (None: start a one-node cluster here); True if this call connected."""
    if ray.is_initialized():
        return False
    ray.init(
        address=cfg.address, namespace=cfg.namespace, include_dashboard=False,
        log_to_driver=os.environ.get("AGENTENV_RAY_LOGS") == "1", configure_logging=False,
    )  # fmt: skip
    return True


def process_rank() -> int:
    """This trainer process's rank (torchrun and `accelerate launch` set RANK)."""
    return int(os.environ.get("RANK", "0"))


def _worker_options(cfg: RayRolloutConfig, index: int) -> dict[str, Any]:
    opts: dict[str, Any] = dict(
        name=f"rollout-worker-{index}", get_if_exists=True, max_restarts=cfg.max_restarts, max_task_retries=0,
        num_cpus=cfg.worker_cpus, resources=dict(cfg.worker_resources), max_concurrency=10_000,
    )  # fmt: skip
    tp = cfg.tensor_parallel_size
    if tp == 1:
        opts["num_gpus"] = 1
    elif tp > 1:
        # vLLM's Ray executor places its tp workers in the placement group the actor runs in.
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = placement_group([{"GPU": 1, "CPU": 1}] * tp, strategy="STRICT_PACK", name=f"rollout-worker-{index}-pg")
        ray.get(pg.ready())
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        opts["num_gpus"] = 0
    return opts


_FIND_TIMEOUT_S = 1800.0
"""How long a rank > 0 waits for rank 0's actors (rank 0 may be loading a model, starting engines)."""


def _made_or_found(name: str, make: Callable[[], Any], lead: bool) -> Any:
    """Rank 0 makes actor `name` (or gets it, if it exists); the others wait for it by name.

    Either way the actor must answer: a name can outlive its actor for a moment
    (an earlier run's, ended with its process), and then it is looked up again.
    """
    from ray.exceptions import RayActorError

    end = time.monotonic() + _FIND_TIMEOUT_S
    while True:
        try:
            if lead:
                actor = make()
            else:
                try:
                    actor = ray.get_actor(name)
                except ValueError:  # not made yet
                    raise RayActorError() from None
            ray.get(actor.__ray_ready__.remote(), timeout=_FIND_TIMEOUT_S)
            return actor
        except RayActorError:  # not made yet, or a dying one of an earlier run
            if time.monotonic() > end:
                raise InfraError(f"rank 0 did not start the actor {name!r} within {_FIND_TIMEOUT_S:g} s") from None
            time.sleep(0.5)


def _store(lead: bool) -> tuple[Any, bool]:
    """The run's `WeightStore`, and whether this process owns the run's actors."""
    namespace = ray.get_runtime_context().namespace
    store = STORES.get(namespace)
    if store is None:
        cls: Any = ray.remote(WeightStore).options(name="weight-store", get_if_exists=True, max_concurrency=1000)
        store = STORES[namespace] = _made_or_found("weight-store", cls.remote, lead)
    return store, lead and bool(ray.get(store.claim.remote(_TOKEN)))


def _start_worker(cls: Any, cfg: RayRolloutConfig, index: int, make_policy: Callable[[], Policy], store: Any) -> Any:
    return cls.options(**_worker_options(cfg, index)).remote(index, make_policy, store)


def start_policy(
    cfg: RayRolloutConfig, make_policy: Callable[[], Policy], tokenizer: Tokenizer, *, route: str = "sticky",
    lead: bool | None = None,
) -> RayPolicy:  # fmt: skip
    """The run's workers (started here, or found if another process started them) as a `RayPolicy`.

    Blocks until every worker has built its engine.
    """
    lead = process_rank() == 0 if lead is None else lead
    store, owner = _store(lead)
    cls: Any = ray.remote(RolloutWorker)
    workers = [
        _made_or_found(f"rollout-worker-{i}", functools.partial(_start_worker, cls, cfg, i, make_policy, store), lead)
        for i in range(cfg.workers)
    ]
    ray.get([w.info.remote() for w in workers])  # every engine up (a start failure raises here)
    return RayPolicy(
        workers, store, tokenizer, lead=lead, owner=owner,
        deadline_s=cfg.deadline_s, chunk_bytes=cfg.weight_chunk_mb << 20, route=route,  # type: ignore[arg-type]
        transport=cfg.weight_transport, gpus_per_worker=cfg.tensor_parallel_size,
    )  # fmt: skip


def start_tool(cfg: RayRolloutConfig, name: str, make_tool: Callable[[], Any]) -> RemoteTool:
    """The prototype of tool `name` (as in `env.tools`) served by an actor with `cfg.tools[name]`'s resources."""
    lead = process_rank() == 0
    _, owner = _store(lead)
    service: Any = ray.remote(ToolService).options(
        name=f"tool-{name}", get_if_exists=True, max_restarts=cfg.max_restarts, max_task_retries=0,
        num_cpus=0, resources=dict(cfg.tools[name]), max_concurrency=10_000,
    )  # fmt: skip
    actor = _made_or_found(f"tool-{name}", lambda: service.remote(make_tool), lead)
    return RemoteTool(actor, ray.get(actor.describe.remote()), owner=owner)
