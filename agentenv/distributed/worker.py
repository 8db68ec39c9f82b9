"""The rollout worker (a Ray actor owning one engine) and the weight store the workers pull from.

The worker wraps a `Policy` built in its own process by a picklable zero-argument
factory (the run's `policy.backend` on its config, or a scripted policy for a
benchmark), so tokens, logprobs, entropies and weight versions come from the
backend's own code. Weights never go to a worker directly: the lead trainer
process puts them in the object store in chunks, stages their refs in the
`WeightStore` with a new version, and asks each worker to `sync` them. A
worker that Ray restarts loads the store's newest in its constructor, before
it serves a call, so it comes back with the current weights. The backend
counts its own loads; the worker maps them to the run's versions, so each
token's version is the push whose weights sampled it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from agentenv.policies.base import JoinsWeightGroup, Policy
from agentenv.types import Closeable, Generation, HasMetrics, ResetsMetrics, SamplingParams


def chunk_tensors(chunk: list[tuple[str, Any, str]]) -> Iterator[tuple[str, Any]]:
    """The `(name, tensor)` pairs of a chunk `tensor_chunks` made (views of the object store's memory: read-only)."""
    import warnings

    import torch

    for name, arr, dtype in chunk:
        with warnings.catch_warnings():  # read-only: the engine's load only reads them
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(arr)
        yield name, t.view(torch.bfloat16) if dtype == "bfloat16" else t


_FETCH_AHEAD = 2
"""Chunks a worker fetches ahead of the one its engine is loading."""


class WeightStore:
    """The newest weights (object refs of `[(name, tensor), ...]` chunks) and their version.

    One per run, a named actor, so that a worker Ray restarts finds the newest
    weights before it serves. The lead trainer process numbers the versions
    (from 1, one per push) and owns the chunks; the store only holds their refs,
    so a lost store is rebuilt from what the lead holds (`RayPolicy`).
    `committed` is the newest version every live worker has loaded (the lead's
    push is done).
    """

    def __init__(self) -> None:
        self.version = 0
        self.refs: list[Any] | None = []
        self.committed = 0
        self.owner: str | None = None

    def claim(self, token: str) -> bool:
        """True for the first caller: it started the run's actors and ends them."""
        if self.owner is None:
            self.owner = token
        return self.owner == token

    def stage(self, at_least: int, refs: list[Any] | None) -> int:
        """Hold `refs` (kept as refs: the chunks stay in the object store; None: sent over NCCL) as the next
        version, and at least `at_least` (the lead's count: a rebuilt store goes on from it)."""
        self.version = max(self.version + 1, at_least)
        self.refs = refs
        return self.version

    def latest(self) -> tuple[int, list[Any] | None]:
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


def _exit_with_raylet(poll_s: float = 1.0) -> None:
    """End this process when the raylet that started it is gone (this process's parent changes).

    Ray's own check missed a worker blocked in its constructor (an engine's
    start): it outlived its node's raylet, holding the engine's memory.
    """
    parent = os.getppid()

    def raylet_alive() -> bool:
        if os.getppid() != parent:
            return False
        try:  # still the raylet: not a process that adopted this one before the watch began
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                return b"raylet" in f.read()
        except OSError:
            return not os.path.isdir("/proc")  # gone; or no /proc here, and the parent is all there is to watch

    def watch() -> None:
        while raylet_alive():
            time.sleep(poll_s)
        os._exit(1)  # no cleanup to wait for: the engine's own processes are reaped with this one

    threading.Thread(target=watch, name="agentenv-raylet-watch", daemon=True).start()


class RolloutWorker:
    """One engine, served to the trainer's processes.

    Args:
        index: Its place among the run's workers.
        make_policy: Builds the engine (`Policy`) in this process.
        store_name: The run's `WeightStore` actor, by name (a rebuilt store has the same name).
        timeout_s: Bound on a weight fetch from the object store.
    """

    def __init__(self, index: int, make_policy: Callable[[], Policy], store_name: str, timeout_s: float = 900.0):
        _exit_with_raylet()
        self.index = index
        self.timeout_s = timeout_s
        self.policy = make_policy()
        # Its optional capabilities, asked once.
        self._group = self.policy if isinstance(self.policy, JoinsWeightGroup) else None
        self._metrics = self.policy if isinstance(self.policy, HasMetrics) else None
        self._resets = self.policy if isinstance(self.policy, ResetsMetrics) else None
        self._closer = self.policy if isinstance(self.policy, Closeable) else None
        self.version = 0
        # The backend counts its own loads from 0; the run's versions are the lead's. policy version -> run version.
        self._run_version: dict[int, int] = {self.policy.weight_version: 0}
        self._lock: asyncio.Lock | None = None
        self._started = time.time()
        version: int
        refs: list[Any] | None
        try:  # a restart: load what the trainer pushed last, before any call is served
            version, refs = ray.get(ray.get_actor(store_name).latest.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - no store now (lost, being rebuilt): the lead's next sync brings the weights
            version, refs = 0, None
        if version > 0 and refs is not None:
            try:
                self._load(version, refs)
            except ray.exceptions.ObjectLostError:  # the process that pushed them has left: the next push will do
                pass

    def _load(self, version: int, refs: list[Any]) -> None:
        def tensors(pool: ThreadPoolExecutor) -> Iterator[tuple[str, Any]]:
            # A chunk is fetched while the one before it loads (from another node it travels; on this
            # one the fetch maps the object store's memory): the engine waits only for the first.
            ahead = [pool.submit(ray.get, ref, timeout=self.timeout_s) for ref in refs[:_FETCH_AHEAD]]
            for k in range(len(refs)):
                chunk = ahead.pop(0).result()
                if k + _FETCH_AHEAD < len(refs):
                    ahead.append(pool.submit(ray.get, refs[k + _FETCH_AHEAD], timeout=self.timeout_s))
                yield from chunk_tensors(chunk)

        with ThreadPoolExecutor(1, thread_name_prefix="agentenv-fetch") as pool:
            self.policy.load_weights(tensors(pool))
        self._run_version[self.policy.weight_version] = version
        self.version = version

    async def sync(self, version: int, refs: list[Any] | None) -> int:
        """Load `version` (the lead's chunks `refs`; None: they come over NCCL) if newer than ours; returns the
        version now served."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if version > self.version and refs is not None:
                # A thread: loading blocks (the vLLM backend waits for running requests), this loop serves them.
                await asyncio.to_thread(self._load, version, refs)
        return self.version

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> list[int]:
        """The GPU path: join the lead's NCCL weight group (`agentenv.policies.weight_group`)."""
        return self._weight_group().join_weight_group(host, port, rank_offset, world_size)

    def _weight_group(self) -> JoinsWeightGroup:
        if self._group is None:
            raise TypeError(f"{type(self.policy).__name__} cannot receive weights over NCCL (the vllm backend can)")
        return self._group

    async def receive_weights(self, version: int) -> int:
        """The GPU path: load the tensors the lead broadcasts now, as `version`."""
        if self._lock is None:
            self._lock = asyncio.Lock()

        def receive() -> None:
            self._weight_group().load_weights_from_group()
            self._run_version[self.policy.weight_version] = version
            self.version = version

        async with self._lock:
            await asyncio.to_thread(receive)
        return self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """The engine's `generate`, each token's version given as the run's (the lead's push that loaded it)."""
        gen = await self.policy.generate(prompt_ids, params)
        if gen.versions is not None:
            gen = dataclasses.replace(gen, versions=[self._run_version[v] for v in gen.versions])
        return gen

    def info(self) -> dict[str, Any]:
        """pid, node, version, uptime and the backend's counters (`metrics()`, where it has them)."""
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "version": self.version,
            "uptime_s": time.time() - self._started,
            "metrics": self._metrics.metrics() if self._metrics is not None else {},
        }

    def reset_metrics(self) -> None:
        if self._resets is not None:
            self._resets.reset_metrics()

    def close(self) -> None:
        """Shut the engine down (its processes, its memory) before the actor is killed."""
        if self._closer is not None:
            self._closer.close()
