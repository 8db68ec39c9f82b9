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
from collections.abc import Callable, Sequence
from typing import Any

import ray

from agentenv.distributed.actors import STORE_NAME, TOKEN, first_line, fmt_resources, made_or_found, make_store
from agentenv.distributed.client import STORES, RayPolicy
from agentenv.distributed.tools import RemoteTool, ToolService
from agentenv.distributed.worker import RolloutWorker
from agentenv.errors import ConfigError, InfraError
from agentenv.policies.base import Policy
from agentenv.rollout.config import RayRolloutConfig
from agentenv.tools.base import Tool
from agentenv.types import Tokenizer


def connect(cfg: RayRolloutConfig) -> bool:
    """Join `cfg.address` (None: start a one-node cluster here); True if this call connected.

    An address where nothing answers is refused at once (`ray.init` would retry
    it without end, printing nothing).
    """
    if ray.is_initialized():
        return False
    if cfg.address is not None:
        _refuse_unreachable(cfg.address, min(cfg.timeout_s, _CONNECT_PROBE_S))
    ray.init(  # None: "local", a cluster of our own (Ray's None joins whatever cluster this machine last started)
        address=cfg.address or "local", namespace=cfg.namespace, include_dashboard=False,
        log_to_driver=os.environ.get("AGENTENV_RAY_LOGS") == "1", configure_logging=False,
    )  # fmt: skip
    if os.environ.get("AGENTENV_RAY_LOGS") != "1":
        _notices_to_logger()
    return True


NOTICES = "agentenv.ray_notices"
"""The logger of Ray's own notices to the driver (a worker died, an actor is pending)."""

_CONNECT_PROBE_S = 10.0
"""Most seconds the probe of `rollout.ray.address` waits for a TCP answer."""


def _refuse_unreachable(address: str, timeout_s: float) -> None:
    """ConfigError naming `rollout.ray.address` unless something accepts a connection there."""
    import socket

    target = address.removeprefix("ray://")
    if target in ("auto", "local"):
        from ray._private.services import canonicalize_bootstrap_address  # RAY_ADDRESS, then `ray start`'s file

        try:
            resolved = canonicalize_bootstrap_address(target)
        except Exception as e:  # noqa: BLE001 - a malformed RAY_ADDRESS: Ray's reason, one line
            raise ConfigError("rollout.ray.address", f"{address}: {first_line(e)}") from None
        if resolved is None:
            if target == "local":
                return
            raise ConfigError(
                "rollout.ray.address", "auto found no cluster on this machine (RAY_ADDRESS is unset and no `ray start` "
                "cluster runs here): start one with `ray start --head`, give HOST:PORT, or leave the key out",
            )  # fmt: skip
        target = resolved
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError("rollout.ray.address", f"{address!r} is not HOST:PORT (or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            "rollout.ray.address",
            f"nothing answers at {target} ({e.strerror or type(e).__name__}): start the cluster there "
            f"(`ray start --head --port {port}`), or leave rollout.ray.address out to start one in this process",
        ) from None


def _notices_to_logger() -> None:
    """Ray's driver prints the cluster's notices ("(raylet) A worker died ...") on stdout even with its logs off;
    they go to the logger `NOTICES` instead (the trainer's engine log takes it)."""
    import logging

    from ray._private import worker as ray_worker

    if not hasattr(ray_worker, "print_to_stdstream"):  # another Ray: its own printing stays
        return
    logger = logging.getLogger(NOTICES)

    def to_logger(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            logger.warning("(%s) %s", data.get("pid", "ray"), line)

    ray_worker.print_to_stdstream = to_logger  # what the notices' listener thread calls


def process_rank() -> int:
    """This trainer process's rank (torchrun and `accelerate launch` set RANK)."""
    return int(os.environ.get("RANK", "0"))


# --------------------------------------------------------------------------- what a worker asks, what the cluster has


def _worker_bundles(cfg: RayRolloutConfig) -> list[dict[str, float]]:
    """The placement group bundles of one worker, all on one node.

    tensor_parallel_size > 1: one GPU bundle per engine rank (vLLM's Ray executor
    places its workers in them); the first also holds the actor's CPUs and custom
    resources, since an actor in a placement group takes its resources from it.
    """
    tp = cfg.tensor_parallel_size
    own = {"CPU": cfg.worker_cpus, "GPU": float(tp == 1), **cfg.worker_resources}
    if tp <= 1:
        return [{k: float(v) for k, v in own.items() if v > 0}]
    first = {**own, "GPU": 1.0, "CPU": max(1.0, cfg.worker_cpus)}
    return [{k: float(v) for k, v in first.items() if v > 0}] + [{"GPU": 1.0, "CPU": 1.0}] * (tp - 1)


def _total(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fits(node: dict[str, float], ask: dict[str, float]) -> int:
    """How many of `ask` one node of these total resources holds."""
    counts = [int(node.get(k, 0.0) / v + 1e-9) for k, v in ask.items() if v > 0]
    return min(counts) if counts else 1 << 30


def _nodes() -> list[dict[str, float]]:
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def _key_of(cfg: RayRolloutConfig, resource: str) -> str:
    if resource == "GPU":
        return "rollout.ray.tensor_parallel_size"
    if resource == "CPU":
        return "rollout.ray.worker_cpus"
    return f"rollout.ray.worker_resources.{resource}"


def check_feasible(cfg: RayRolloutConfig) -> None:
    """Refuse, before anything waits, what the cluster's nodes cannot hold however long one waits.

    Counts the nodes' total resources (what other actors hold now is a wait,
    bounded by `rollout.ray.timeout_s`, not a refusal).
    """
    nodes = _nodes()
    ask = _total(_worker_bundles(cfg))
    have = fmt_resources(_total(nodes))
    fit = sum(_fits(n, ask) for n in nodes)
    if fit == 0:
        # the first resource no node has enough of for one worker names the key
        order = sorted(ask, key=lambda k: (k != "GPU", k == "CPU"))  # GPUs first: the usual reason
        short = next((k for k in order if max((n.get(k, 0.0) for n in nodes), default=0.0) + 1e-9 < ask[k]), order[0])
        most = max((n.get(short, 0.0) for n in nodes), default=0.0)
        raise ConfigError(
            _key_of(cfg, short),
            f"each rollout worker asks {fmt_resources(ask)} on one node, and no node of the cluster has {ask[short]:g} "
            f"{short} (the most on one node: {most:g}; the cluster's {len(nodes)} nodes have {have} in all)"
            + (": use tensor_parallel_size 0 on CPU nodes" if short == "GPU" else ""),
        )
    if fit < cfg.workers:
        raise ConfigError(
            "rollout.ray.workers",
            f"{cfg.workers} rollout workers asked, each {fmt_resources(ask)} on one node; the cluster's {len(nodes)} nodes "
            f"({have} in all) hold {fit}",
        )
    for name, res in cfg.tools.items():
        tool_ask = {k: float(v) for k, v in res.items()}
        if not any(_fits(n, tool_ask) for n in nodes):
            raise ConfigError(
                f"rollout.ray.tools.{name}", f"asks {fmt_resources(tool_ask)}, and no node of the cluster has it ({have} in all)"
            )


def _placement(cfg: RayRolloutConfig, index: int) -> Any:
    """Reserve worker `index`'s resources within `cfg.timeout_s`, or say what is missing (InfraError)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = _worker_bundles(cfg)
    if not any(bundles[0].values()):
        return None
    pg = placement_group(bundles, strategy="STRICT_PACK", name=f"rollout-worker-{index}-pg")
    if not pg.wait(timeout_seconds=cfg.timeout_s):
        remove_placement_group(pg)
        ask, avail = _total(bundles), ray.available_resources()
        free = fmt_resources({k: avail.get(k, 0.0) for k in ask})
        raise InfraError(
            f"rollout worker {index} got no resources within rollout.ray.timeout_s={cfg.timeout_s:g} s: it asks "
            f"{fmt_resources(ask)} on one node, the cluster has {free} free (other actors or runs hold the rest)"
        )
    return pg


def _worker_options(cfg: RayRolloutConfig, index: int, pg: Any) -> dict[str, Any]:
    opts: dict[str, Any] = dict(
        name=f"rollout-worker-{index}", get_if_exists=True, max_restarts=cfg.max_restarts, max_task_retries=0,
        num_cpus=cfg.worker_cpus, resources=dict(cfg.worker_resources), max_concurrency=10_000,
        num_gpus=1 if cfg.tensor_parallel_size == 1 else 0,
    )  # fmt: skip
    if pg is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # the actor takes its resources from the first bundle; vLLM's Ray executor places its tp workers in the rest
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=cfg.tensor_parallel_size > 1,
        )  # fmt: skip
    return opts


def _store(lead: bool, timeout_s: float) -> tuple[Any, bool]:
    """The run's `WeightStore`, and whether this process owns the run's actors."""
    namespace = ray.get_runtime_context().namespace
    store = STORES.get(namespace)
    if store is None:
        store = STORES[namespace] = made_or_found(STORE_NAME, make_store, lead, timeout_s)
    return store, lead and bool(ray.get(store.claim.remote(TOKEN), timeout=timeout_s))


def _exists(name: str) -> bool:
    try:
        ray.get_actor(name)
        return True
    except ValueError:
        return False


def _start_worker(cls: Any, cfg: RayRolloutConfig, index: int, make_policy: Callable[[], Policy], pg: Any) -> Any:
    if _exists(f"rollout-worker-{index}"):  # another process's (or one Ray restarts): no new actor
        return ray.get_actor(f"rollout-worker-{index}")
    return cls.options(**_worker_options(cfg, index, pg)).remote(index, make_policy, STORE_NAME, cfg.timeout_s)


def start_policy(
    cfg: RayRolloutConfig, make_policy: Callable[[], Policy], tokenizer: Tokenizer, *, route: str = "sticky",
    lead: bool | None = None,
) -> RayPolicy:  # fmt: skip
    """The run's workers (started here, or found if another process started them) as a `RayPolicy`.

    Blocks until every worker has built its engine; each wait is bounded by
    `cfg.timeout_s`, and what the cluster cannot hold is refused first.
    """
    lead = process_rank() == 0 if lead is None else lead
    cls: Any = ray.remote(RolloutWorker)
    groups: dict[int, Any] = {}
    workers: list[Any] = []
    owner = False
    try:
        if lead:  # every worker's resources first: no engine starts on a cluster that cannot hold them all
            check_feasible(cfg)
            for i in range(cfg.workers):
                groups[i] = None if _exists(f"rollout-worker-{i}") else _placement(cfg, i)
        store, owner = _store(lead, cfg.timeout_s)
        for i in range(cfg.workers):
            make = functools.partial(_start_worker, cls, cfg, i, make_policy, groups.get(i))
            workers.append(made_or_found(f"rollout-worker-{i}", make, lead, cfg.timeout_s))
        ray.get([w.info.remote() for w in workers], timeout=cfg.timeout_s)  # every engine up
    except BaseException:
        # A start that fails leaves nothing: the reservations made here, and, if this process made the run's
        # actors, the workers made so far and the store.
        _remove_groups(groups)
        if owner:
            for w in workers:
                ray.kill(w, no_restart=True)
            namespace = ray.get_runtime_context().namespace
            ray.kill(STORES.pop(namespace), no_restart=True)
        raise
    return RayPolicy(
        workers, store, tokenizer, lead=lead, owner=owner,
        deadline_s=cfg.deadline_s, chunk_bytes=cfg.weight_chunk_mb << 20, route=route,  # type: ignore[arg-type]
        transport=cfg.weight_transport, gpus_per_worker=cfg.tensor_parallel_size, timeout_s=cfg.timeout_s,
        groups=[g for g in groups.values() if g is not None],
    )  # fmt: skip


def _remove_groups(groups: dict[int, Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in groups.values():
        if pg is not None:
            remove_placement_group(pg)


def start_tool(cfg: RayRolloutConfig, name: str, make_tool: Callable[[], Any]) -> Tool | Sequence[Tool]:
    """The prototype of tool `name` (as in `env.tools`) served by an actor with `cfg.tools[name]`'s resources: one
    `RemoteTool` (typed as what a tool part makes, which it stands in for)."""
    lead = process_rank() == 0
    if lead:
        check_feasible(cfg)
    _, owner = _store(lead, cfg.timeout_s)
    service: Any = ray.remote(ToolService).options(
        name=f"tool-{name}", get_if_exists=True, max_restarts=cfg.max_restarts, max_task_retries=0,
        num_cpus=0, resources=dict(cfg.tools[name]), max_concurrency=10_000,
    )  # fmt: skip
    actor = made_or_found(f"tool-{name}", lambda: service.remote(make_tool), lead, cfg.timeout_s)
    return RemoteTool(actor, ray.get(actor.describe.remote(), timeout=cfg.timeout_s), owner=owner)
