"""`RayPolicy`: the trainer's `Policy` over the run's rollout workers.

`generate` goes to the worker the router picks (sticky by the episode's
`ROUTE_KEY`); a worker that dies under a call, or leaves it unanswered past
`deadline_s`, fails that call with `InfraError` (the rollout records a failed
trajectory and the step goes on), is marked down, and, killed if it hung, is
restarted by Ray; it serves again once it reports the current weight version.

`load_weights` on the lead process (rank 0) puts the weights in the object
store in chunks, stages them in the `WeightStore` as the next version, and has
every live worker load them; the other processes only wait for that version.
So `weight_version` is the store's version, the same on every process. The
lead owns the chunks, so a lost store (its actor killed, its node gone) is
made again from them, with the same version, and the run goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from agentenv.distributed.actors import STORE_NAME, TOKEN, first_line, made_or_found, make_store
from agentenv.distributed.router import RouteMode, Router
from agentenv.errors import InfraError
from agentenv.policies.routing import ROUTE_KEY
from agentenv.types import Generation, SamplingParams, Tokenizer

log = logging.getLogger(__name__)


def tensor_chunks(items: Iterable[tuple[str, Any]], chunk_bytes: int) -> Iterator[list[tuple[str, Any, str]]]:
    """`[(name, numpy array, torch dtype name), ...]` lists of about `chunk_bytes` each, for the object store.

    Numpy arrays, not tensors: Ray writes an array's buffer into the object
    store as it is and a worker reads it there without a copy, where a pickled
    tensor is copied on both sides (about 10x slower end to end). No copy here
    either: `ray.put` copies the buffer before the trainer changes it.
    bfloat16 has no numpy type: it travels as its int16 bits, named. The worker reads
    them back with `agentenv.distributed.worker.chunk_tensors`.
    """
    import torch

    chunk: list[tuple[str, Any, str]] = []
    size = 0
    for name, tensor in items:
        t = tensor.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        chunk.append((name, arr, dtype))
        size += arr.nbytes
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


STORES: dict[str, Any] = {}
"""The run's `WeightStore` handle per namespace, held while this process uses it: Ray ends an actor nobody holds."""

_AWAIT_PUSH = "await-push"
"""In `_revive`: a restarted worker that gets its weights with the next NCCL broadcast."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class RayPolicy:
    """A `Policy` whose engines are Ray actors.

    Args:
        workers: The rollout workers' actor handles.
        store: The run's `WeightStore` actor.
        tokenizer: The model's tokenizer.
        lead: This process pushes the weights (rank 0); others wait for its pushes.
        owner: This process started the actors and ends them at `close`.
        deadline_s: A call unanswered this long: its worker is killed (Ray restarts it).
        chunk_bytes: Size of a weight chunk in the object store.
        route: `sticky` (the router's default) or `random` (a benchmark's baseline).
        timeout_s: Bound on a worker's weight load, a store call, a follower's wait for a push.
        groups: The workers' placement groups (the owner removes them at `close`).
    """

    def __init__(
        self, workers: list[Any], store: Any, tokenizer: Tokenizer, *, lead: bool = True, owner: bool = True,
        deadline_s: float | None = 600.0, chunk_bytes: int = 64 << 20, route: RouteMode = "sticky",
        transport: Literal["object_store", "nccl"] = "object_store", gpus_per_worker: int = 1,
        timeout_s: float = 900.0, groups: list[Any] | None = None,
    ):  # fmt: skip
        self.workers = workers
        self.store = store
        self.tokenizer = tokenizer
        self.lead = lead
        self.owner = owner
        self.deadline_s = deadline_s
        self.chunk_bytes = chunk_bytes
        self.router = Router(len(workers), route)
        self.timeout_s = timeout_s
        self._groups = list(groups or [])
        self.weight_version: int = self._on_store(lambda st: st.latest.remote())[0]
        self._refs: list[Any] | None = None  # the newest chunks (None: none, or sent over NCCL), for restarted workers
        self.store_rebuilds = 0
        """Times the lead made the lost `WeightStore` again."""
        self._revive: dict[int, Any] = {}  # down worker -> its pending `sync` call
        self.failures = 0
        """Calls failed by a dead or late worker."""
        self.restarts = 0
        """Workers brought back after a failure."""
        self._closed = False
        self.transport = transport
        self.gpus_per_worker = max(1, gpus_per_worker)
        self._group: Any = None  # the lead's WeightGroup (transport nccl)
        self._group_members: list[int] = []

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """One continuation from the worker the router picks for the current episode."""
        if self._closed:
            raise RuntimeError("RayPolicy is closed")
        self.poll()
        if not self.router.live():
            await self._wait_for_a_worker()
        i = self.router.pick(ROUTE_KEY.get())
        self.router.started(i)
        ref = self.workers[i].generate.remote([int(t) for t in prompt_ids], params)
        try:
            gen: Generation = await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.deadline_s)
            return gen
        except TimeoutError:
            self._lost(i, kill=True)
            raise InfraError(
                f"rollout worker {i} did not answer within rollout.ray.deadline_s={self.deadline_s:g} s: restarting it"
            ) from None
        except RayActorError as e:
            self._lost(i, kill=False)
            raise InfraError(f"rollout worker {i} died: {first_line(e)}") from None
        except asyncio.CancelledError:  # the episode's own limit: free the engine of the request
            ray.cancel(ref)
            raise
        finally:
            self.router.finished(i)

    def _lost(self, i: int, *, kill: bool) -> None:
        self.failures += 1
        if not self.router.up[i]:
            return
        self.router.mark_down(i)
        if kill:
            ray.kill(self.workers[i], no_restart=False)
        # Queued until Ray has restarted the actor, whose constructor loads the newest weights.
        self._revive[i] = self._sync(i)

    def poll(self) -> None:
        """Bring back the down workers that answer with the current weights (never blocks)."""
        for i, ref in list(self._revive.items()):
            if ref is _AWAIT_PUSH:
                continue
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            try:
                version = ray.get(ref)
            except Exception:  # noqa: BLE001 - died again, or the weights' owner is gone: ask again
                self._revive[i] = self._sync(i)
                continue
            if version < self.weight_version:  # a push went on while it was down
                if self.transport == "nccl":  # its weights come with the next broadcast (the group is rebuilt)
                    self._revive[i] = _AWAIT_PUSH
                    continue
                self._revive[i] = self._sync(i)
                continue
            del self._revive[i]
            self.router.mark_up(i)
            self.restarts += 1

    async def _wait_for_a_worker(self) -> None:
        end = None if self.deadline_s is None else time.monotonic() + self.deadline_s
        while not self.router.live():
            if end is not None and time.monotonic() > end:
                raise InfraError(f"no rollout worker came back within rollout.ray.deadline_s={self.deadline_s:g} s")
            await asyncio.sleep(0.1)
            self.poll()

    def wait_until_all_up(self, timeout_s: float) -> None:
        """Block until every worker serves the current weights (tests, benchmarks, the end of a run)."""
        end = time.monotonic() + timeout_s
        while len(self.router.live()) < len(self.workers):
            if time.monotonic() > end:
                raise InfraError(f"workers {sorted(self._revive)} did not come back within {timeout_s:g} s")
            time.sleep(0.1)
            self.poll()

    # ------------------------------------------------------------------ weights

    def _sync(self, i: int) -> Any:
        """Worker `i` loads the newest version (the chunks this process holds) unless it has it."""
        return self.workers[i].sync.remote(self.weight_version, self._refs)

    def _on_store(self, call: Callable[[Any], Any]) -> Any:
        """`ray.get(call(store))` within `timeout_s`; a lost store is made again (the lead) or found again."""
        for attempt in range(2):
            try:
                return ray.get(call(self.store), timeout=self.timeout_s)
            except RayActorError as e:
                if attempt:
                    raise InfraError(f"the run's weight store was lost again while being rebuilt: {first_line(e)}") from None
                self._replace_store()
            except GetTimeoutError:
                raise InfraError(
                    f"the run's weight store did not answer within rollout.ray.timeout_s={self.timeout_s:g} s"
                ) from None
            except RayTaskError as e:  # its own error (a follower's wait for the lead's push past the bound)
                raise InfraError(f"weight store: {first_line(e.as_instanceof_cause())}") from None

    def _replace_store(self) -> None:
        """The store's actor is gone: the lead makes it again from the chunks it holds; the others find that one."""
        namespace = ray.get_runtime_context().namespace
        STORES.pop(namespace, None)
        if not self.lead:
            self.store = STORES[namespace] = made_or_found(STORE_NAME, make_store, False, self.timeout_s)
            return
        log.warning("the run's weight store was lost; made again from this process's weights (version %d)",
                    self.weight_version)  # fmt: skip
        store = made_or_found(STORE_NAME, make_store, True, self.timeout_s)
        if self.owner:
            ray.get(store.claim.remote(TOKEN), timeout=self.timeout_s)
        if self.weight_version > 0:
            ray.get(store.stage.remote(self.weight_version, self._refs), timeout=self.timeout_s)
            ray.get(store.commit.remote(self.weight_version), timeout=self.timeout_s)
        self.store = STORES[namespace] = store
        self.store_rebuilds += 1

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> None:
        """Push the trainer's weights to every worker as a new version (blocks until they serve it).

        Every process calls it (sharded weights are gathered collectively); the
        lead sends, the others wait for the lead's version. A worker that fails
        to load is marked down and catches up when Ray has restarted it.
        """
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        if not self.lead:
            for _ in items:  # take part in the gathers
                pass
            after = self.weight_version
            self.weight_version = self._on_store(lambda st: st.wait_committed.remote(after, self.timeout_s))
            return
        # Owned by this process (Ray ties an object to its owner): the lead holds the newest weights for the run.
        if self.transport == "nccl":
            self._push_nccl(items)
            return
        refs = [ray.put(chunk) for chunk in tensor_chunks(items, self.chunk_bytes)]
        version = self._stage(refs)
        self.poll()
        calls = {i: self._sync(i) for i in self.router.live()}
        for i, call in calls.items():
            try:
                ray.get(call, timeout=self.timeout_s)  # a load (and a worker still starting) may take long
            except GetTimeoutError:
                self._lost(i, kill=True)
            except RayActorError:
                self._lost(i, kill=False)
        for i in list(self._revive):  # down: they load this version as they come back
            self._revive[i] = self._sync(i)
        self._on_store(lambda st: st.commit.remote(version))

    def _stage(self, refs: list[Any] | None) -> int:
        """The next version (above this process's and the store's) with these chunks, staged in the store."""
        self._refs = refs  # the previous version's chunks are freed with the old list
        mine = self.weight_version + 1
        staged: int = self._on_store(lambda st: st.stage.remote(mine, refs))
        self.weight_version = staged
        return staged

    def _push_nccl(self, items: Iterable[tuple[str, Any]]) -> None:
        """The GPU path: broadcast the tensors over the NCCL weight group, one at a time, no host copy.

        The store gets the version without chunks, so a worker Ray restarts
        cannot pull them: it waits, down, for the next push, which rebuilds the
        group with it (a group's members are fixed when it is made).
        """
        from agentenv.policies.weight_group import WeightGroup

        version = self._stage(None)
        self.poll()
        members = sorted(self.router.live() + [i for i, r in self._revive.items() if r is _AWAIT_PUSH])
        if self._group is None or members != self._group_members:
            if self._group is not None:
                self._group.close()
            host, port = ray.util.get_node_ip_address(), _free_port()
            world = 1 + len(members) * self.gpus_per_worker
            self._group = WeightGroup(host, port, 0, world, backend="nccl", device="cuda")
            joins = [
                self.workers[i].join_weight_group.remote(host, port, 1 + k * self.gpus_per_worker, world)
                for k, i in enumerate(members)
            ]
            ray.get(joins, timeout=self.timeout_s)
            self._group_members = members
        calls = {i: self.workers[i].receive_weights.remote(version) for i in members}
        self._group.send(items)
        for i, call in calls.items():
            try:
                ray.get(call, timeout=self.timeout_s)  # a load (and a worker still starting) may take long
            except (GetTimeoutError, RayActorError):
                self._group_members = []  # rebuilt at the next push
                self._lost(i, kill=True)
                continue
            if self._revive.get(i) is _AWAIT_PUSH:
                del self._revive[i]
                self.router.mark_up(i)
                self.restarts += 1
        self._on_store(lambda st: st.commit.remote(version))

    # ------------------------------------------------------------------ observation and lifetime

    def worker_info(self) -> list[dict[str, Any]]:
        """Each live worker's `RolloutWorker.info()` (pid, node, version, engine counters).

        Raises:
            InfraError: A worker did not answer within `rollout.ray.timeout_s`.
        """
        return self._ask_live("info", lambda w: w.info.remote())

    def _ask_live(self, what: str, call: Callable[[Any], Any]) -> list[Any]:
        """`call(worker)` of every live worker, answered within `timeout_s` (a hung engine is named, not waited on)."""
        live = self.router.live()
        try:
            return list(ray.get([call(self.workers[i]) for i in live], timeout=self.timeout_s))
        except GetTimeoutError:
            raise InfraError(f"rollout workers {live} did not all answer {what}() within "
                             f"rollout.ray.timeout_s={self.timeout_s:g} s") from None  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """Engine counters summed over the live workers; the prefix-cache hit rate over all of them."""
        infos = self.worker_info()
        out: dict[str, float] = {}
        for info in infos:
            for k, v in info["metrics"].items():
                out[k] = out.get(k, 0.0) + float(v)
        if out.get("prompt_tokens"):
            out["prefix_cache_hit_rate"] = out.get("cached_prompt_tokens", 0.0) / out["prompt_tokens"]
        out.update({"workers_up": float(len(infos)), "failures": float(self.failures), "restarts": float(self.restarts)})
        return out

    def reset_metrics(self) -> None:
        self._ask_live("reset_metrics", lambda w: w.reset_metrics.remote())

    def close(self) -> None:
        """The owner shuts every engine down and ends the actors; others only let go. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._refs = None
        if self._group is not None:
            self._group.close()
        if not self.owner:
            return
        closing = [w.close.remote() for w in self.workers]
        for w, call in zip(self.workers, closing, strict=True):
            try:
                ray.get(call, timeout=120)
            except Exception:  # noqa: BLE001 - a dead or hung worker is killed below all the same
                pass
            ray.kill(w, no_restart=True)
        from ray.util.placement_group import remove_placement_group

        for pg in self._groups:  # the workers' reserved resources
            remove_placement_group(pg)
        ray.kill(self.store, no_restart=True)
        for namespace, held in list(STORES.items()):
            if held == self.store:
                del STORES[namespace]
