"""Joining the Ray cluster and starting a run's actors from `rollout.ray`.

Every trainer process runs the same code: actors are named in the run's
namespace and created with `get_if_exists`, so the first process to get there
starts them and the others find them. The first to claim the `WeightStore`
owns the actors (ends them at close); rank 0 pushes the weights.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import ray

from agentenv.distributed.client import RayPolicy
from agentenv.distributed.tools import RemoteTool, ToolService
from agentenv.distributed.worker import RolloutWorker, WeightStore
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


def _store() -> Any:
    """The run's `WeightStore` (made by the first process to ask, found by the others)."""
    cls: Any = ray.remote(WeightStore)
    return cls.options(name="weight-store", get_if_exists=True, max_concurrency=1000).remote()


def start_policy(
    cfg: RayRolloutConfig, make_policy: Callable[[], Policy], tokenizer: Tokenizer, *, route: str = "sticky",
    lead: bool | None = None,
) -> RayPolicy:  # fmt: skip
    """The run's workers (started here, or found if another process started them) as a `RayPolicy`.

    Blocks until every worker has built its engine.
    """
    store = _store()
    owner = bool(ray.get(store.claim.remote(_TOKEN)))
    cls: Any = ray.remote(RolloutWorker)
    workers = [cls.options(**_worker_options(cfg, i)).remote(i, make_policy, store) for i in range(cfg.workers)]
    ray.get([w.info.remote() for w in workers])  # every engine up (a start failure raises here)
    return RayPolicy(
        workers, store, tokenizer, lead=process_rank() == 0 if lead is None else lead, owner=owner,
        deadline_s=cfg.deadline_s, chunk_bytes=cfg.weight_chunk_mb << 20, route=route,  # type: ignore[arg-type]
        transport=cfg.weight_transport, gpus_per_worker=cfg.tensor_parallel_size,
    )  # fmt: skip


def start_tool(cfg: RayRolloutConfig, name: str, make_tool: Callable[[], Any]) -> RemoteTool:
    """The prototype of tool `name` (as in `env.tools`) served by an actor with `cfg.tools[name]`'s resources."""
    store = _store()
    owner = bool(ray.get(store.claim.remote(_TOKEN)))
    service: Any = ray.remote(ToolService)
    actor = (
        service
        .options(
            name=f"tool-{name}", get_if_exists=True, max_restarts=cfg.max_restarts, max_task_retries=0,
            num_cpus=0, resources=dict(cfg.tools[name]), max_concurrency=10_000,
        )  # fmt: skip
        .remote(make_tool)
    )
    return RemoteTool(actor, ray.get(actor.describe.remote()), owner=owner)
