"""Where a training step's groups come from: one interface, a synchronous and an asynchronous source.

The trainer asks its `BatchSource` for each step's groups (`next`) and says when
the step's weights are pushed (`step_done`); it never asks which kind it holds.

- `SyncBatches` (`trainer.max_staleness` = 0): each step draws `tasks_per_step`
  tasks, rolls out this process's share and lets the algorithm resample
  (dynamic sampling, `Algorithm.resample`, through `StepRounds`).
- `AsyncBatches` (eta >= 1): the asynchronous producer
  (`agentenv.training.async_rollout.AsyncRollout`) rolls out ahead of the
  trainer, on a loop thread of its own, within the staleness bound.

`Rollouts` is the rollout both sample with: one group per task through the
algorithm's sampler (or the user's agent), seeded from the run seed, a sampler
that raises losing its own group, never the step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch

from agentenv._loops import LoopThread, gather_settled
from agentenv.algorithms.base import Algorithm, Sampler
from agentenv.configs import RunConfig
from agentenv.errors import ConfigError
from agentenv.rollout import derive_seed
from agentenv.rollout.engine import failed_group
from agentenv.tasks.task import Task
from agentenv.training.async_rollout import AsyncRollout, Pending
from agentenv.training.build import Runtime
from agentenv.training.data import TaskStream
from agentenv.training.metrics import reduce_sum
from agentenv.types import Group

if TYPE_CHECKING:
    from accelerate import Accelerator

log = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutLoop:
    """The event loop rollout runs on: a fresh one driven from the trainer's thread, or (`threaded`, asynchronous
    training) one in a thread of its own, so rollout goes on while the trainer updates."""

    def __init__(self, threaded: bool):
        self.thread = LoopThread("agentenv-rollout") if threaded else None
        self.loop = self.thread.loop if self.thread is not None else asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result."""
        if self.thread is not None:
            result: T = self.thread.run(coro)
            return result
        return self.loop.run_until_complete(coro)

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.stop()
        else:
            self.loop.close()


class Rollouts:
    """This process's rollout for the trainer: one group per task, seeded from the run seed.

    Args:
        cfg: The run config (`policy`'s sampling, `rollout`'s limits, `trainer.seed`).
        rt: The policy, the env factory and the user's agent, if any.
        algorithm: Its sampler grows each group.
    """

    def __init__(self, cfg: RunConfig, rt: Runtime, algorithm: Algorithm):
        self.cfg = cfg
        self.rt = rt
        self.algorithm = algorithm

    def sampler(self) -> Sampler:
        """The algorithm's sampler (or the user's agent's), bounding each trajectory and the concurrency."""
        # rollout.agent or a client env: the user's agent through the endpoint (independent samples)
        return self.rt.agent_sampler(self.algorithm.group_size()) or self.algorithm.sampler(self.cfg.rollout)

    async def sample(self, sampler: Sampler, task: Task, seed: int) -> Group:
        """One group of `task`; a sampler that raises gives a group of failed trajectories."""
        params = self.cfg.policy.sampling_params()
        try:
            return await sampler.sample(self.rt.policy, self.rt.make_env, task, params, seed)
        except Exception as e:  # noqa: BLE001 - recorded as failed trajectories (docs/reliability.md)
            return failed_group(task, self.algorithm.group_size(), e, {"seed": seed})

    async def groups(self, tasks: list[Task], step: int, indices: list[int], round_: int = 0) -> list[Group]:
        """One group per task; task `indices` (positions in the global batch) seed the samples, and
        `round_`, the step's extra sampling round (dynamic sampling), so that its seeds differ from the first's.

        A trajectory that is late or breaks is recorded as failed by the
        sampler, and the step goes on with the rest; a sampler that raises
        loses its own group (all failed), never the step.
        """
        sampler = self.sampler()  # bounds each trajectory and the step's concurrency

        async def one(j: int, task: Task) -> Group:
            seed = derive_seed(self.cfg.trainer.seed, step, indices[j], *((round_,) if round_ else ()))
            return await self.sample(sampler, task, seed)

        return await gather_settled(*(one(j, t) for j, t in enumerate(tasks)))

    def version(self) -> int:
        """The policy's current weight version."""
        return int(self.rt.policy.weight_version)


@dataclass
class StepBatch:
    """What one step trains on, and how it came.

    Attributes:
        groups: This process's groups.
        task_ids: Every task the step drew, over all processes (dynamic sampling's extra draws included).
        version: The trainer's weight version when the batch was taken.
        dropped: Groups dropped as too stale since the last batch (asynchronous; their tasks were requeued).
        metrics: The source's own (dynamic sampling's), logged as they are.
    """

    groups: list[Group]
    task_ids: list[str]
    version: int
    dropped: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class BatchSource(ABC):
    """A training step's groups: `next` each step, `step_done` once its weights are pushed.

    It keeps the run's clock of the data flow (`flow_metrics`): the share of
    wall time the trainer waited for data and the engines waited for work.

    Args:
        rollouts: The rollout the groups are sampled with.
        stream: The run's task stream.
        acc: The `accelerate.Accelerator` (rank, world, reductions).
    """

    asynchronous: ClassVar[bool]

    def __init__(self, rollouts: Rollouts, stream: TaskStream, acc: Accelerator):
        self.rollouts = rollouts
        self.stream = stream
        self.acc = acc
        self.tps = rollouts.cfg.trainer.tasks_per_step
        self.restart_clock()

    @abstractmethod
    def next(self, step: int) -> StepBatch:
        """The groups step `step` (0-based) trains on."""

    def start(self) -> None:
        """Called once before the first step of a run (after the initial evaluation); default: nothing to start."""
        return None

    def step_done(self) -> None:
        """The trainer updated and pushed its weights; default: nothing waits for it."""
        return None

    def stop(self) -> None:
        """No step follows: stop rolling out (the groups beyond the last step are not trained on); default: none runs."""
        return None

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the data: the stream's cursor and the groups drawn and not trained on."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's `trainer_state.json` (what `state_dict` wrote)."""

    @abstractmethod
    def engine_idle_frac(self, waited_frac: float) -> float:
        """The share of wall time the engines had no group in flight (`waited_frac`: the trainer's waiting share)."""

    def restart_clock(self) -> None:
        """Over the run: wall-clock start, seconds the trainer waited for data, tokens trained on, dropped groups."""
        self._clock = {"start": time.perf_counter(), "wait_s": 0.0, "tokens": 0.0, "dropped": 0.0}

    def flow_metrics(self, staleness: list[int], dropped: int, t_roll: float, m: dict[str, float]) -> dict[str, float]:
        """Staleness of this batch, dropped groups, and over the run so far: the share of wall time the trainer
        waited for data and the engines waited for work (no group in flight), and generated tokens per second."""
        clock = self._clock
        clock["wait_s"] += t_roll
        clock["tokens"] += m["rollout/gen_tokens_per_group"] * len(staleness) * self.acc.num_processes  # all ranks
        clock["dropped"] += dropped
        wall = max(time.perf_counter() - clock["start"], 1e-9)
        waited = min(clock["wait_s"] / wall, 1.0)
        return {
            "async/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
            "async/staleness_max": float(max(staleness, default=0)),
            "async/dropped_groups": float(dropped),
            "async/dropped_total": clock["dropped"],
            "time/trainer_wait_frac": waited,
            "time/engine_idle_frac": self.engine_idle_frac(waited),
            "time/tokens_per_s": clock["tokens"] / wall,
        }


class SyncBatches(BatchSource):
    """Each step draws `tasks_per_step` tasks, rolls out this process's share, then the algorithm's `resample`."""

    asynchronous = False

    def __init__(self, rollouts: Rollouts, stream: TaskStream, acc: Accelerator, loop: RolloutLoop):
        super().__init__(rollouts, stream, acc)
        self.loop = loop

    def next(self, step: int) -> StepBatch:
        rank, world = self.acc.process_index, self.acc.num_processes
        version = self.rollouts.version()
        tasks = self.stream.next_batch(self.tps)
        mine = tasks[rank::world]
        groups = self.loop.run(self.rollouts.groups(mine, step, list(range(rank, len(tasks), world))))
        rounds = StepRounds(self, step, [t.id for t in tasks])
        groups, metrics = self.rollouts.algorithm.resample(groups, rounds)
        return StepBatch(groups, rounds.task_ids, version, 0, metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict(), "pending": []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        if state.get("pending"):
            log.warning("the checkpoint's %d groups in flight are not regenerated (trainer.max_staleness=0): "
                        "their tasks are skipped", len(state["pending"]))

    def engine_idle_frac(self, waited_frac: float) -> float:
        return 1.0 - waited_frac  # synchronous: the engines work only while the trainer waits for the rollout


@dataclass
class StepRounds:
    """The step's rollout as dynamic sampling sees it (`agentenv.algorithms.base.StepRollout`): extra rounds of this
    step's seeds, the task stream (the tasks it draws join `task_ids`) and the sum over processes."""

    source: SyncBatches
    step: int
    task_ids: list[str]

    @property
    def rank(self) -> int:
        return int(self.source.acc.process_index)

    @property
    def world(self) -> int:
        return int(self.source.acc.num_processes)

    def rollout(self, tasks: list[Task], indices: list[int], round_: int) -> list[Group]:
        return self.source.loop.run(self.source.rollouts.groups(tasks, self.step, indices, round_=round_))

    def draw(self, n: int) -> list[Task]:
        tasks: list[Task] = self.source.stream.next_batch(n)
        self.task_ids += [t.id for t in tasks]
        return tasks

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        return reduce_sum(self.source.acc, t)


def refuse_async_world(cfg: RunConfig, world: int) -> None:
    """Asynchronous training (`trainer.max_staleness` >= 1) runs in one trainer process: refused by name otherwise.

    A fact of the config and the launch, so the command checks it before any process starts work.
    """
    eta = cfg.trainer.max_staleness
    if eta >= 1 and world > 1:
        raise ConfigError(
            "trainer.max_staleness",
            f"{eta} needs one trainer process (this run has {world}): the asynchronous producer "
            "draws the task stream alone; scale rollout with the policy's engines (Ray placement) instead",
        )


class AsyncBatches(BatchSource):
    """The asynchronous producer's batches: the next `tasks_per_step` finished groups within the staleness bound.

    It is also what the producer samples with (`agentenv.training.async_rollout.GroupSource`): a group's seed is the
    synchronous loop's for its (step, slot), changed by a requeued group's attempt.
    """

    asynchronous = True

    def __init__(self, rollouts: Rollouts, stream: TaskStream, acc: Accelerator, loop: RolloutLoop):
        super().__init__(rollouts, stream, acc)
        assert loop.thread is not None, "asynchronous rollout runs on a loop thread of its own"
        self.thread = loop.thread
        self.resume: list[Pending] = []  # groups drawn but not trained on at the checkpoint resumed from
        self.producer: AsyncRollout | None = None
        self._sampler: Sampler | None = None

    @staticmethod
    def check(cfg: RunConfig, algorithm: Algorithm, world: int) -> None:
        """What asynchronous rollout does not run, refused by name with the reason."""
        tc = cfg.trainer
        refuse_async_world(cfg, world)
        if algorithm.max_resample_rounds() > 0:
            raise ConfigError(
                "trainer.max_staleness",
                f"{tc.max_staleness} with dynamic sampling ({cfg.algorithm.name}'s max_resample_rounds="
                f"{algorithm.max_resample_rounds()}): its lockstep extra rounds wait for a whole step's groups, "
                "which asynchronous rollout never does; set algorithm.max_resample_rounds=0 or trainer.max_staleness=0",
            )

    def start(self) -> None:
        """The producer, on the rollout loop; groups of a resumed run's checkpoint first."""
        tc = self.rollouts.cfg.trainer
        self._sampler = self.rollouts.sampler()  # one for the run: its concurrency bound spans every step in flight
        self.producer = AsyncRollout(
            self.thread, self, self.tps, tc.max_staleness, resume=self.resume, next_seq=self.stream.cursor
        )

    # ------------------------------------------------------------------ what the producer samples with
    async def sample(self, p: Pending) -> Group:
        assert self._sampler is not None
        tc = self.rollouts.cfg.trainer
        # (step, slot) as the synchronous loop's seeds; a requeued group's attempt changes them
        seed = derive_seed(tc.seed, p.seq // self.tps, p.seq % self.tps, *((0, p.attempt) if p.attempt else ()))
        return await self.rollouts.sample(self._sampler, p.task, seed)

    def draw(self) -> Task:
        task: Task = self.stream.next_batch(1)[0]
        return task

    def version(self) -> int:
        return self.rollouts.version()

    # ------------------------------------------------------------------ the trainer's side
    def next(self, step: int) -> StepBatch:
        if self.producer is None:
            self.start()
        assert self.producer is not None
        taken = self.producer.take()
        return StepBatch(taken.groups, [g.task.id for g in taken.groups], taken.version, taken.dropped)

    def step_done(self) -> None:
        if self.producer is not None:
            self.producer.step_done()  # rollout may run one step further

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def state_dict(self) -> dict[str, Any]:
        stream, pending = self.stream.state_dict(), []
        if self.producer is not None:  # the groups drawn and not trained on: regenerated from their seeds on resume
            drawn, next_seq = self.producer.snapshot()
            stream = {**stream, "cursor": next_seq}
            pending = [[p.seq, p.task.id, p.attempt] for p in drawn]
        return {"stream": stream, "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        by_id = {t.id: t for t in self.rollouts.rt.tasks.train}
        # groups drawn but not trained on at the checkpoint: rolled out again from their seeds
        self.resume = [Pending(seq, by_id[tid], attempt) for seq, tid, attempt in state.get("pending", [])]

    def engine_idle_frac(self, waited_frac: float) -> float:
        if self.producer is None:
            return 1.0 - waited_frac
        return self.producer.engine_idle_s() / max(self.producer.elapsed_s(), 1e-9)
