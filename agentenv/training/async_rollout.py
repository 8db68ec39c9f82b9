"""Asynchronous rollout across steps: groups roll out ahead of the trainer, within a staleness bound.

With `trainer.max_staleness` = eta >= 1 the trainer does not wait for a step's
rollout to start the next: a producer on the trainer's event loop (in its own
thread) keeps groups rolling out while the trainer recomputes, updates and
pushes weights. Finished groups land in a buffer; each step takes the next
`tasks_per_step` of them. Two rules hold the policy's lag to eta versions:

- admission (as AReaL's): the producer starts a group only while the groups
  started and not dropped number fewer than (steps done + eta + 1) *
  tasks_per_step, so rollout runs at most eta steps ahead of the trainer;
- the filter: a group whose oldest token was sampled more than eta weight
  versions before the trainer's current one is dropped (counted), and its task
  goes back to the front of the queue with a new seed. So every batch holds
  staleness <= eta, whatever the tail of the latency.

A token's version is the one the policy stamped on it (`Generation.versions`,
through `Segment.versions`); a policy that stamps none is taken to have sampled
at the version current when the group started (a lower bound: the bound still holds).

Everything runs on the loop's thread; the trainer's thread calls `take`,
`step_done` and `snapshot` through it (`LoopThread.run`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentenv._loops import LoopThread
from agentenv.tasks.task import Task
from agentenv.types import Group


@dataclass(frozen=True)
class Pending:
    """A group drawn from the task stream and not trained on yet.

    Attributes:
        seq: Its place in the run's draw order (the stream's cursor when drawn):
            nominally step seq // tasks_per_step, slot seq % tasks_per_step.
        task: The task.
        attempt: 0, then +1 each time the group was dropped as too stale (its seed changes).
    """

    seq: int
    task: Task
    attempt: int = 0


@dataclass
class Ready:
    """A finished group in the buffer, with the version bounds of its tokens."""

    pending: Pending
    group: Group
    oldest: int  # the oldest weight version that sampled one of its tokens
    newest: int
    tokens: int  # policy tokens generated


@dataclass
class Batch:
    """What one step trains on, and how it came.

    Attributes:
        groups: `tasks_per_step` groups, in draw order.
        staleness: Per group, the trainer's version minus the group's oldest token version.
        dropped: Groups dropped as too stale since the last batch (their tasks were requeued).
        wait_s: Seconds the trainer waited for this batch.
        version: The trainer's (policy's) weight version when it took the batch.
    """

    groups: list[Group]
    staleness: list[int]
    dropped: int
    wait_s: float
    version: int


@dataclass
class _Clock:
    """Wall time with no group in flight (the engines waiting for work)."""

    start: float = field(default_factory=time.perf_counter)
    idle_s: float = 0.0
    idle_since: float | None = None

    def busy(self, now: float) -> None:
        if self.idle_since is not None:
            self.idle_s += now - self.idle_since
            self.idle_since = None

    def idle(self, now: float) -> None:
        if self.idle_since is None:
            self.idle_since = now

    def idle_total(self, now: float) -> float:
        return self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)


def group_versions(group: Group, fallback: int) -> tuple[int, int, int]:
    """(oldest, newest, tokens): the weight versions of a group's policy tokens and their count; a token with no
    version counts as `fallback` (the version when the group started)."""
    versions = [fallback if v is None else v for t in group for v in t.versions]
    if not versions:
        return fallback, fallback, 0
    return min(versions), max(versions), len(versions)


class GroupSource(Protocol):
    """What the producer samples with (the trainer's `agentenv.training.batches.AsyncBatches`)."""

    async def sample(self, p: Pending) -> Group:
        """The group of `p.task` (the trainer's sampler with the group's seed); it never raises."""
        ...

    def draw(self) -> Task:
        """The next task of the run's stream."""
        ...

    def version(self) -> int:
        """The policy's current weight version."""
        ...


class AsyncRollout:
    """The producer, the buffer and the staleness filter.

    Args:
        loop: The loop thread the rollout runs on (the trainer's).
        source: Samples a pending group, draws the next task, says the policy's weight version.
        tasks_per_step: Groups per batch.
        max_staleness: eta.
        resume: Groups drawn but not trained on at the checkpoint: they are
            rolled out again first (from their seeds), in order.
        next_seq: The draw order's next number (the stream's cursor).
    """

    def __init__(
        self,
        loop: LoopThread,
        source: GroupSource,
        tasks_per_step: int,
        max_staleness: int,
        resume: list[Pending] | None = None,
        next_seq: int = 0,
    ):
        self.loop = loop
        self.source = source
        self.tps = tasks_per_step
        self.eta = max_staleness
        self.next_seq = next_seq
        self.queue: list[Pending] = list(resume or [])  # to start, before new draws (requeued first)
        self.running: dict[int, Pending] = {}  # seq -> group in flight
        self.ready: list[Ready] = []
        self.steps_done = 0  # steps trained and pushed since the producer started
        self.admitted = 0  # groups started and not dropped since the producer started
        self.dropped_total = 0
        self._dropped_since = 0
        self.tokens = 0  # policy tokens of every finished group (dropped ones included)
        self._clock = _Clock()
        self._clock.idle(self._clock.start)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake: asyncio.Event | None = None
        self._closed = False

    # ------------------------------------------------------------------ loop side
    def _room(self) -> int:
        """Groups the producer may still start: (steps done + eta + 1) * tasks_per_step, less those admitted."""
        return (self.steps_done + self.eta + 1) * self.tps - self.admitted

    def _fill(self) -> None:
        now = time.perf_counter()
        while not self._closed and self._room() > 0:
            if self.queue:
                p = self.queue.pop(0)
            else:
                p = Pending(self.next_seq, self.source.draw())
                self.next_seq += 1
            self.admitted += 1
            self.running[p.seq] = p
            task = asyncio.get_running_loop().create_task(self._one(p, self.source.version()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.running:
            self._clock.busy(now)

    async def _one(self, p: Pending, start_version: int) -> None:
        group = await self.source.sample(p)
        oldest, newest, n = group_versions(group, start_version)
        self.tokens += n
        del self.running[p.seq]
        self.ready.append(Ready(p, group, oldest, newest, n))
        if not self.running:
            self._clock.idle(time.perf_counter())
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _drop_stale(self, version: int) -> None:
        """Drop buffered groups more than eta versions behind `version`; requeue their tasks (new attempt)."""
        keep = []
        for r in self.ready:
            if version - r.oldest > self.eta:
                self.admitted -= 1
                self.dropped_total += 1
                self._dropped_since += 1
                self.queue.insert(0, Pending(r.pending.seq, r.pending.task, r.pending.attempt + 1))
            else:
                keep.append(r)
        self.ready = keep
        self.queue.sort(key=lambda p: p.seq)  # the oldest draws first: they are the ones nearest to the bound

    async def _take(self) -> tuple[list[Ready], int]:
        if self._wake is None:
            self._wake = asyncio.Event()
        while True:
            version = self.source.version()
            self._drop_stale(version)
            self._fill()
            if len(self.ready) >= self.tps:
                self.ready.sort(key=lambda r: (r.oldest, r.pending.seq))  # the stalest first: nearest the bound
                taken, self.ready = self.ready[: self.tps], self.ready[self.tps :]
                taken.sort(key=lambda r: r.pending.seq)  # a batch in draw order (eta = 0: the synchronous order)
                return taken, version
            self._wake.clear()
            await self._wake.wait()

    def _step_done(self) -> None:
        self.steps_done += 1
        self._fill()

    def _snapshot(self) -> tuple[list[Pending], int]:
        pending = sorted([*self.queue, *self.running.values(), *(r.pending for r in self.ready)], key=lambda p: p.seq)
        return pending, self.next_seq

    async def _cancel(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:  # each group's cleanup runs to its end (its envs' tools close on cancellation)
            await asyncio.wait(tasks)

    # ------------------------------------------------------------------ trainer side (another thread)
    def take(self) -> Batch:
        """Block until `tasks_per_step` groups within the bound are ready; the stalest first, in draw order."""
        t0 = time.perf_counter()

        async def run() -> tuple[list[Ready], int, int]:
            taken, version = await self._take()
            dropped, self._dropped_since = self._dropped_since, 0
            return taken, version, dropped

        taken, version, dropped = self.loop.run(run())
        staleness = [version - r.oldest for r in taken]
        if any(not 0 <= s <= self.eta for s in staleness):  # the filter's invariant, checked on every batch
            raise RuntimeError(f"a batch's staleness {staleness} is outside [0, {self.eta}]")
        return Batch([r.group for r in taken], staleness, dropped, time.perf_counter() - t0, version)

    def step_done(self) -> None:
        """The trainer updated and pushed its weights: rollout may run one step further."""
        self.loop.call_soon(self._step_done)

    def snapshot(self) -> tuple[list[Pending], int]:
        """(groups drawn and not yet trained on, in draw order; the draw order's next number)."""

        async def run() -> tuple[list[Pending], int]:
            return self._snapshot()

        snapshot: tuple[list[Pending], int] = self.loop.run(run())
        return snapshot

    def engine_idle_s(self) -> float:
        """Wall seconds since the start with no group in flight."""
        return self._clock.idle_total(time.perf_counter())

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._clock.start

    def close(self) -> None:
        """Cancel the groups in flight and wait for their cleanup."""
        if not self.loop.loop.is_closed() and self.loop.thread.is_alive():
            self.loop.run(self._cancel())
