"""A run's named actors: made by rank 0 or found by name, each wait within a deadline, errors in one line."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from agentenv.distributed.worker import WeightStore
from agentenv.errors import InfraError

STORE_NAME = "weight-store"
"""The run's `WeightStore` actor, in the run's namespace."""

TOKEN = uuid.uuid4().hex
"""This process, for the store's claim."""


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def fmt_resources(res: dict[str, float]) -> str:
    """`{CPU: 2, rollout: 1}`: the resources an actor can ask for (not memory, not node ids)."""
    hidden = ("node:", "accelerator_type:", "memory", "object_store_memory", "bundle_group_")
    shown = sorted((k, v) for k, v in res.items() if not k.startswith(hidden) and "_group_" not in k)  # not a placement group's
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown) + "}"


def init_error(e: BaseException) -> str:
    """The constructor's own error, one line, out of Ray's account of the actor's death."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and not ln.startswith(("File ", "Traceback"))]
    return errors[-1] if errors else (lines[0] if lines else type(e).__name__)


def made_or_found(name: str, make: Callable[[], Any], lead: bool, timeout_s: float) -> Any:
    """Rank 0 makes actor `name` (or gets it, if it exists); the others wait for it by name.

    Either way the actor must answer within `timeout_s`: a name can outlive its
    actor for a moment (an earlier run's, ended with its process), and then it
    is looked up again. An actor whose constructor raised, or that does not
    answer in time, raises InfraError with one line; rank 0 kills one that did
    not answer, so nothing of it keeps running.
    """
    end = time.monotonic() + timeout_s
    while True:
        actor = None
        try:
            if lead:
                actor = make()
            else:
                try:
                    actor = ray.get_actor(name)
                except ValueError:  # not made yet
                    raise RayActorError() from None
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, end - time.monotonic()))
            return actor
        except GetTimeoutError:
            if lead and actor is not None:
                ray.kill(actor, no_restart=True)
            raise InfraError(
                f"the actor {name!r} did not start within rollout.ray.timeout_s={timeout_s:g} s: its constructor "
                "(the engine's start) is still running or hangs (its output is in the Ray session's worker logs), "
                f"or it waits for resources (the cluster has {fmt_resources(ray.available_resources())} free)"
                + ("" if lead else "; rank 0 makes it")
            ) from None
        except RayActorError as e:  # not made yet, or a dying one of an earlier run, or its constructor raised
            if e.actor_init_failed:
                raise InfraError(f"the actor {name!r} failed to start: {init_error(e)}") from None
            if time.monotonic() > end:
                raise InfraError(
                    f"the actor {name!r} was not there within rollout.ray.timeout_s={timeout_s:g} s"
                    + ("" if lead else " (rank 0 makes it)")
                ) from None
            time.sleep(0.2)


def make_store() -> Any:
    """The run's `WeightStore` (or the live one of that name)."""
    cls: Any = ray.remote(WeightStore)
    return cls.options(name=STORE_NAME, get_if_exists=True, max_concurrency=1000).remote()
