"""The rollout worker (a Ray actor owning one engine) and the weight store the workers pull from.

The worker wraps a `Policy` built in its own process by a picklable zero-argument
factory (the run's `policy.backend` on its config, or a scripted policy for a
benchmark), so tokens, logprobs, entropies and weight versions come from the
backend's own code. Weights never go to a worker directly: the lead trainer
process puts them in the object store in chunks, stages their refs in the
`WeightStore` with a new version, and asks each worker to `sync`. A worker
that Ray restarts syncs in its constructor, before it serves a call, so it
comes back with the current weights.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray

from agentenv.policies.base import Policy
from agentenv.types import Generation, SamplingParams


class WeightStore:
    """The newest weights (object refs of `[(name, tensor), ...]` chunks) and their version.

    One per run, a named actor. Versions count pushes from 1; `committed` is the
    newest version every live worker has loaded (the lead's push is done).
    """

    def __init__(self) -> None:
        self.version = 0
        self.refs: list[Any] = []
        self.committed = 0
        self.owner: str | None = None

    def claim(self, token: str) -> bool:
        """True for the first caller: it started the run's actors and ends them."""
        if self.owner is None:
            self.owner = token
        return self.owner == token

    def stage(self, refs: list[Any]) -> int:
        """Hold `refs` (kept as refs: the chunks stay in the object store) as the next version."""
        self.version += 1
        self.refs = refs
        return self.version

    def latest(self) -> tuple[int, list[Any]]:
        return self.version, self.refs

    def commit(self, version: int) -> None:
        self.committed = max(self.committed, version)

    async def wait_committed(self, after: int, timeout_s: float) -> int:
        """The first committed version above `after` (another process's push), within `timeout_s`."""
        end = time.monotonic() + timeout_s
        while self.committed <= after:
            if time.monotonic() > end:
                raise TimeoutError(f"no weight push after version {after} within {timeout_s:g} s")
            await asyncio.sleep(0.02)
        return self.committed


class RolloutWorker:
    """One engine, served to the trainer's processes.

    Args:
        index: Its place among the run's workers.
        make_policy: Builds the engine (`Policy`) in this process.
        store: The run's `WeightStore` actor.
    """

    def __init__(self, index: int, make_policy: Callable[[], Policy], store: Any):
        self.index = index
        self.policy = make_policy()
        self.store = store
        self.version = 0
        self._lock: asyncio.Lock | None = None
        self._started = time.time()
        version, refs = ray.get(store.latest.remote())
        if version > 0:  # a restart: load what the trainer pushed last, before any call is served
            try:
                self._load(version, refs)
            except ray.exceptions.ObjectLostError:  # the process that pushed them has left: the next push will do
                self.policy.weight_version = self.version = 0

    def _load(self, version: int, refs: list[Any]) -> None:
        def tensors() -> Iterator[tuple[str, Any]]:
            for ref in refs:  # one chunk at a time from the object store
                yield from ray.get(ref)

        # The backend counts +1 per load; start it one below so every Generation reports the store's version.
        self.policy.weight_version = version - 1
        self.policy.load_weights(tensors())
        self.version = version

    async def sync(self) -> int:
        """Load the store's newest weights if newer than ours; returns the version now served."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            version, refs = await self.store.latest.remote()
            if version > self.version:
                # A thread: loading blocks (the vLLM backend waits for running requests), this loop serves them.
                await asyncio.to_thread(self._load, version, refs)
        return self.version

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> list[int]:
        """The GPU path: join the lead's NCCL weight group (`agentenv.policies.weight_group`)."""
        join = getattr(self.policy, "join_weight_group", None)
        if join is None:
            raise TypeError(f"{type(self.policy).__name__} cannot receive weights over NCCL (the vllm backend can)")
        ranks: list[int] = join(host, port, rank_offset, world_size)
        return ranks

    async def receive_weights(self, version: int) -> int:
        """The GPU path: load the tensors the lead broadcasts now, as `version`."""
        if self._lock is None:
            self._lock = asyncio.Lock()

        def receive() -> None:
            self.policy.weight_version = version - 1
            self.policy.load_weights_from_group()  # type: ignore[attr-defined]  # join_weight_group checked it has one
            self.version = version

        async with self._lock:
            await asyncio.to_thread(receive)
        return self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await self.policy.generate(prompt_ids, params)

    def info(self) -> dict[str, Any]:
        """pid, node, version, uptime and the backend's counters (`metrics()`, where it has them)."""
        metrics = getattr(self.policy, "metrics", None)
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "version": self.version,
            "uptime_s": time.time() - self._started,
            "metrics": metrics() if metrics is not None else {},
        }

    def reset_metrics(self) -> None:
        reset = getattr(self.policy, "reset_metrics", None)
        if reset is not None:
            reset()

    def close(self) -> None:
        """Shut the engine down (its processes, its memory) before the actor is killed."""
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()
