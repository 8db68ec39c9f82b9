"""The Accelerate trainer: roll out, score, advantages, update, push weights, log, checkpoint.

One code path for one CPU process, DDP or FSDP2 (`trainer.strategy`, see
`sharding`) on CPU processes or GPUs, and several nodes (`accelerate launch` /
`torchrun`). Each rank rolls out its own share of
every batch; Accelerate all-reduces the gradients; metrics are reduced across
ranks. The trainer only orchestrates: sampling is the algorithm's sampler,
advantages and the loss are the algorithm's pure functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from agentenv._loops import LoopThread, gather_settled
from agentenv.algorithms import get_algorithm
from agentenv.algorithms.base import Algorithm, LossNorm, TrainBatch, own_tool_results
from agentenv.algorithms.core import episode_outcomes, kl_k3
from agentenv.configs import RunConfig
from agentenv.errors import ConfigError, InfraError, TrainingStopped
from agentenv.policies.models import resolve_model_path
from agentenv.rollout import derive_seed
from agentenv.rollout.engine import failed_group
from agentenv.rollout.toolstats import ToolStats
from agentenv.tasks.rewards import reward_error_counts
from agentenv.tasks.task import Task, balanced_subset
from agentenv.training import checkpoint as ckpt
from agentenv.training import sharding
from agentenv.training.async_rollout import AsyncRollout, Pending, group_versions
from agentenv.training.batching import chunks, collate
from agentenv.training.build import Runtime, build_runtime, check_output_dir, first_line
from agentenv.training.data import TaskStream
from agentenv.training.engine_log import EngineLog
from agentenv.training.evaluate import EvalReport, evaluate
from agentenv.training.metrics import MetricsLogger
from agentenv.training.packing import packing_enabled
from agentenv.training.rollout_log import RolloutLog
from agentenv.training.schedule import lr_factor
from agentenv.training.scoring import token_logprobs
from agentenv.types import Group

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    steps: int
    output_dir: Path
    final_eval: EvalReport | None
    initial_eval: EvalReport | None


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


class Trainer:
    """Trains `cfg.model` with `cfg.algorithm` on `cfg.env`.

    Args:
        cfg: The validated run config.
        resume: Continue from the newest complete checkpoint in `trainer.output_dir`.
        accelerator: An `accelerate.Accelerator` (one is made if None).
        runtime: Prebuilt tools/policy/tasks (built from cfg if None).
        async_rollout: Roll out through the asynchronous producer
            (`agentenv.training.async_rollout`); None: when `trainer.max_staleness`
            >= 1. With eta = 0 it trains on exactly the synchronous loop's batches (a test holds it to that).
    """

    def __init__(
        self,
        cfg: RunConfig,
        *,
        resume: bool = False,
        accelerator: Any = None,
        runtime: Runtime | None = None,
        async_rollout: bool | None = None,
    ):
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        tc = cfg.trainer
        world = self.acc.num_processes
        if tc.tasks_per_step % world or tc.mini_batch_tasks % world:
            raise ConfigError(
                "trainer.tasks_per_step",
                f"{tc.tasks_per_step} and trainer.mini_batch_tasks {tc.mini_batch_tasks} "
                f"must be divisible by the number of processes {world}",
            )
        if self.acc.gradient_accumulation_steps != 1:  # Accelerate would divide each micro-batch loss again
            raise ConfigError(
                "gradient_accumulation_steps",
                f"the Accelerate config sets {self.acc.gradient_accumulation_steps}; leave it at 1: the trainer "
                "accumulates the micro-batches of trainer.mini_batch_tasks itself (trainer.micro_batch_size)",
            )
        set_seed(tc.seed)
        self.out = Path(tc.output_dir)
        check_output_dir(self.out)  # before minutes of model loading
        self.algorithm: Algorithm = get_algorithm(cfg.algorithm.name)(cfg.algorithm_config)
        self.asynchronous = tc.max_staleness >= 1 if async_rollout is None else async_rollout
        if self.asynchronous:
            self._check_async(world)
        # Asynchronous: the rollout's loop runs in its own thread, so rollout goes on while this thread updates.
        self._loop_thread = LoopThread("agentenv-rollout") if self.asynchronous else None
        self.loop = self._loop_thread.loop if self._loop_thread is not None else asyncio.new_event_loop()
        self.producer: AsyncRollout | None = None
        self._resume_pending: list[Pending] = []

        model_path = resolve_model_path(cfg.model.path) if self.acc.is_main_process else None
        self.acc.wait_for_everyone()
        model_path = model_path or resolve_model_path(cfg.model.path)
        rank = self.acc.process_index
        self.engine_log = EngineLog(
            None if cfg.logging.verbose else self.out / ("engine.log" if rank == 0 else f"engine.rank{rank}.log")
        )
        if self.engine_log.path is not None and self.acc.is_main_process:
            print(f"[train] engine output: {self.engine_log.path} (logging.verbose=true shows it here)",
                  file=sys.stderr, flush=True)
        dtype = getattr(torch, cfg.model.dtype)
        # The engine's start and the models' loading print pages of logs and progress bars: to the engine log.
        with self.engine_log.capture():
            self.rt = runtime or build_runtime(cfg, model_path)
            try:
                model = AutoModelForCausalLM.from_pretrained(self.rt.model_path, dtype=dtype)
            except (OSError, ValueError) as e:
                raise ConfigError(
                    "model.path", f"cannot load a model from {self.rt.model_path!r}: {first_line(e)}"
                ) from None
            self.ref_model = None
            if self.algorithm.needs_reference():
                self.ref_model = AutoModelForCausalLM.from_pretrained(self.rt.model_path, dtype=dtype).eval()
                self.ref_model.requires_grad_(False)
                self.ref_model.to(self.acc.device)
        self.stream = TaskStream(self.rt.tasks.train, seed=tc.seed)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        updates_per_step = tc.ppo_epochs * (tc.tasks_per_step // tc.mini_batch_tasks)
        total = max(1, tc.steps * updates_per_step)
        self.total_updates = total
        # shared prefixes once in recompute and update (auto: for algorithms that grow trees)
        self.pack = packing_enabled(tc.pack_prefixes, model, trees=self.algorithm.grows_trees)
        self.fuse_old_logprobs = self._update_yields_old_logprobs(model)
        self.strategy = sharding.Strategy(self.acc, tc.strategy, cfg.model.lora)
        self.model, self.opt, self.sched = self.strategy.prepare(
            model,
            lambda params: torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay),
            lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, lambda u: lr_factor(u, total, tc.warmup_steps, tc.lr_schedule, tc.min_lr_ratio)
            ),
        )
        if hasattr(self.sched, "split_batches"):  # Accelerate's wrapper (not under fsdp2, which keeps the bare one)
            # Accelerate steps a scheduler once per process per call (it assumes per-process batches); an
            # update here is global (a mini-batch spans every process): one step, or the schedule runs `world` x fast.
            self.sched.split_batches = True
        self.pad_id = self._pad_id()
        self.start_step = 0
        self.resumed_from: Path | None = None
        self.resume_skipped: list[tuple[Path, str]] = []  # newer checkpoints found damaged, with why
        self._failed_streak = 0  # consecutive steps in which every trajectory failed
        self._nonfinite_streak = 0  # consecutive steps with a non-finite loss or gradient
        self._tool_streak: Counter[str] = Counter()  # tool -> consecutive steps in which most of its calls failed
        self.last_tool_stats = ToolStats()
        # over the run: wall-clock start, seconds the trainer waited for data, tokens trained on, dropped groups
        self._run_clock = {"start": time.perf_counter(), "wait_s": 0.0, "tokens": 0.0, "dropped": 0.0}
        if resume:
            self._resume()
        purge = (self.start_step + 1 if self.start_step else 0) if resume else None
        self.logger = MetricsLogger(self.out, cfg.logging, cfg.to_dict(), purge) if self.acc.is_main_process else None
        self.rollout_log = (  # this process's groups, for `agentenv view`
            RolloutLog(self.out, cfg.logging, self.rt.tokenizer, self.start_step if resume else None)
            if self.acc.is_main_process and cfg.logging.save_rollouts else None
        )  # fmt: skip
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
        self.push_weights()

    def _resume(self) -> None:
        """Load the newest intact checkpoint (saying which damaged ones were skipped); cut the logs back to it."""
        chosen = None
        if self.acc.is_main_process:
            chosen, self.resume_skipped = ckpt.find_resumable(self.out)
            for path, why in self.resume_skipped:
                log.warning("checkpoint %s cannot be resumed from: %s", path, why)
            if chosen is not None and self.resume_skipped:
                log.warning("resuming from the newest intact checkpoint, %s", chosen)
            elif chosen is None:
                log.warning("no intact checkpoint in %s: starting at step 0", self.out / "checkpoints")
        chosen = _broadcast_path(chosen)
        if chosen is not None:
            try:
                self.acc.load_state(str(chosen))
                self.strategy.load(self.model, self.opt, chosen)
            except Exception as e:  # verified, yet unloadable: never continue half-loaded
                raise InfraError(
                    f"checkpoint {chosen} passed verification but did not load ({type(e).__name__}: {e}); "
                    "move it aside to resume from an older one"
                ) from e
            state = ckpt.read_state(chosen)
            self.stream.load_state_dict(state["stream"])
            by_id = {t.id: t for t in self.rt.tasks.train}
            # groups drawn but not trained on at the checkpoint: rolled out again from their seeds
            self._resume_pending = [Pending(seq, by_id[tid], attempt) for seq, tid, attempt in state.get("pending", [])]
            if self._resume_pending and not self.asynchronous:
                log.warning("the checkpoint's %d groups in flight are not regenerated (trainer.max_staleness=0): "
                            "their tasks are skipped", len(self._resume_pending))
            self.start_step = int(state["step"])
            self.resumed_from = chosen
        if self.acc.is_main_process:
            ckpt.truncate_logs(self.out, self.start_step)

    # ------------------------------------------------------------------ helpers
    def _pad_id(self) -> int:
        tok = self.rt.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def unwrapped(self) -> torch.nn.Module:
        return self.acc.unwrap_model(self.model)

    def push_weights(self) -> None:
        """Send the trainer's weights to the rollout policy, one full tensor at a time (gathered, LoRA merged)."""
        self.rt.policy.load_weights(sharding.full_weights(self.unwrapped()))

    def run(self, coro: Any) -> Any:
        if self._loop_thread is not None:  # asynchronous: the loop runs in its thread
            return self._loop_thread.run(coro)
        return self.loop.run_until_complete(coro)

    def _check_async(self, world: int) -> None:
        """What asynchronous rollout does not run, refused by name with the reason."""
        tc = self.cfg.trainer
        refuse_async_world(self.cfg, world)
        if self.algorithm.max_resample_rounds() > 0:
            raise ConfigError(
                "trainer.max_staleness",
                f"{tc.max_staleness} with dynamic sampling ({self.cfg.algorithm.name}'s max_resample_rounds="
                f"{self.algorithm.max_resample_rounds()}): its lockstep extra rounds wait for a whole step's groups, "
                "which asynchronous rollout never does; set algorithm.max_resample_rounds=0 or trainer.max_staleness=0",
            )

    def _group_sampler(self) -> Any:
        """The algorithm's sampler (or the user's agent's), bounding each trajectory and the concurrency."""
        # rollout.agent or a client env: the user's agent through the endpoint (independent samples)
        return self.rt.agent_sampler(self.algorithm.group_size()) or self.algorithm.sampler(self.cfg.rollout)

    async def _sample(self, sampler: Any, task: Task, seed: int) -> Group:
        params = self.cfg.policy.sampling_params()
        try:
            return cast(Group, await sampler.sample(self.rt.policy, self.rt.make_env, task, params, seed))
        except Exception as e:  # noqa: BLE001 - recorded as failed trajectories (docs/reliability.md)
            return failed_group(task, self.algorithm.group_size(), e, {"seed": seed})

    def _start_producer(self) -> AsyncRollout:
        """The asynchronous producer, on the rollout loop; groups of a resumed run's checkpoint first."""
        tc = self.cfg.trainer
        sampler = self._group_sampler()  # one for the run: its concurrency bound spans every step in flight
        tps = tc.tasks_per_step

        async def sample(p: Pending) -> Group:
            # (step, slot) as the synchronous loop's seeds; a requeued group's attempt changes them
            seed = derive_seed(tc.seed, p.seq // tps, p.seq % tps, *((0, p.attempt) if p.attempt else ()))
            return await self._sample(sampler, p.task, seed)

        assert self._loop_thread is not None
        return AsyncRollout(
            self._loop_thread, sample, lambda: self.stream.next_batch(1)[0], lambda: self.rt.policy.weight_version,
            tps, tc.max_staleness, resume=self._resume_pending, next_seq=self.stream.cursor,
        )  # fmt: skip

    # ------------------------------------------------------------------ one step
    async def rollout(self, tasks: list[Task], step: int, indices: list[int], round_: int = 0) -> list[Group]:
        """One group per task; task `indices` (positions in the global batch) seed the samples, and
        `round_`, the step's extra sampling round (dynamic sampling), so that its seeds differ from the first's.

        A trajectory that is late or breaks is recorded as failed by the
        sampler, and the step goes on with the rest; a sampler that raises
        loses its own group (all failed), never the step.
        """
        sampler = self._group_sampler()  # bounds each trajectory and the step's concurrency

        async def one(j: int, task: Task) -> Group:
            seed = derive_seed(self.cfg.trainer.seed, step, indices[j], *((round_,) if round_ else ()))
            return await self._sample(sampler, task, seed)

        return await gather_settled(*(one(j, t) for j, t in enumerate(tasks)))

    def resample(self, groups: list[Group], step: int) -> tuple[list[Group], dict[str, float]]:
        """The algorithm's dynamic sampling (DAPO; `Algorithm.resample`), with this step's rollout, the task
        stream (the tasks it draws join `last_batch_ids`) and the sum over processes."""

        def rollout(tasks: list[Task], indices: list[int], round_: int) -> list[Group]:
            return self.run(self.rollout(tasks, step, indices, round_=round_))

        def draw(n: int) -> list[Any]:
            tasks = self.stream.next_batch(n)
            self.last_batch_ids += [t.id for t in tasks]
            return tasks

        return self.algorithm.resample(
            groups, rollout, draw, self.reduce_sum, self.acc.process_index, self.acc.num_processes
        )

    @torch.no_grad()
    def recompute(self, batch: TrainBatch, model: torch.nn.Module, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logprobs of the batch under `model`, in micro-batches: (B, T); only `rows` (bool, (B,)) when given
        (the others stay 0: the update's first mini-batch fills its own, `_update_yields_old_logprobs`)."""
        out = torch.zeros_like(batch.old_logprobs)
        index = torch.arange(len(batch)) if rows is None else torch.nonzero(rows).flatten()
        mb = self.cfg.trainer.micro_batch_size
        parts = chunks(len(index), mb)
        for s in parts:
            part = batch.select(index[s]).trimmed().to(self.acc.device)
            lp = token_logprobs(model, part.input_ids, part.attention_mask, self.cfg.policy.temperature, pack=self.pack)
            out[index[s], : lp.shape[1]] = lp.float().cpu()  # columns past the trim stay 0 (padding)
        if model is not self.ref_model:
            self._idle_passes(batch, len(parts), backward=False)
        return out * batch.loss_mask

    def _idle_passes(self, batch: TrainBatch, done: int, backward: bool) -> None:
        """Under fsdp2 every forward is a collective: a rank with fewer micro-batches runs empty ones (loss 0)."""
        for _ in range(self.strategy.common_count(done) - done):
            part = batch.select(slice(0, 1)).trimmed().to(self.acc.device)
            with torch.set_grad_enabled(backward):
                lp = token_logprobs(self.model, part.input_ids, part.attention_mask, self.cfg.policy.temperature)
                if backward:
                    self.acc.backward(lp.sum() * 0.0)

    def train_step(self, step: int) -> dict[str, float]:
        tc = self.cfg.trainer
        rank, world = self.acc.process_index, self.acc.num_processes
        t0 = time.perf_counter()
        version = self.rt.policy.weight_version
        if self.producer is not None:  # asynchronous: the next finished groups within the staleness bound
            taken = self.producer.take()
            groups, version = taken.groups, taken.version
            self.last_batch_ids = [g.task.id for g in groups]
            resample_metrics: dict[str, float] = {}
            dropped = taken.dropped
        else:
            tasks = self.stream.next_batch(tc.tasks_per_step)
            mine = tasks[rank::world]
            groups = self.run(self.rollout(mine, step, list(range(rank, len(tasks), world))))
            self.last_batch_ids = [t.id for t in tasks]
            groups, resample_metrics = self.resample(groups, step)
            dropped = 0
        # weight versions behind the trainer's, per group: the policy's lag, <= trainer.max_staleness on every batch
        staleness = [version - group_versions(g, version)[0] for g in groups]
        if any(not 0 <= s <= tc.max_staleness for s in staleness):
            raise InfraError(f"a batch broke the staleness bound {tc.max_staleness}: {staleness} (trainer version {version})")
        self.last_errors = Counter(t.error or "unknown error" for g in groups for t in g if t.failed)
        t_roll = time.perf_counter() - t0

        trajs, advs, group_of = [], [], []
        for gi, g in enumerate(groups):
            for traj, a in zip(g.trajectories, self.algorithm.advantages(g)):
                trajs.append(traj)
                advs.append(a)
                group_of.append(gi)
        batch = collate(trajs, advs, self.pad_id)
        t1 = time.perf_counter()
        tasks_per_mb = tc.mini_batch_tasks // world
        group_idx = torch.tensor(group_of)
        # the first mini-batch's forward, before any optimizer step, is under the weights the recompute would use
        fused = (group_idx < tasks_per_mb) if self.fuse_old_logprobs else torch.zeros(len(batch), dtype=torch.bool)
        self.model.eval()
        batch.old_logprobs = self.recompute(batch, self.unwrapped(), rows=~fused)
        if self.ref_model is not None:
            batch.ref_logprobs = self.recompute(batch, self.ref_model)
        self.model.train()
        t_old = time.perf_counter() - t1
        batch_metrics = self.algorithm.finalize(batch, trajs, self.reduce_sum)  # batch-level advantages
        if self.rollout_log is not None:
            self.rollout_log.train_step(step + 1, groups, trajs, batch)

        # updates: this rank's tasks split into mini-batches of whole groups
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        skipped = 0  # updates whose gradient norm was not finite
        for epoch in range(tc.ppo_epochs):
            for g0 in range(0, len(groups), tasks_per_mb):
                rows = torch.nonzero((group_idx >= g0) & (group_idx < g0 + tasks_per_mb)).flatten()
                fill = (batch, rows) if epoch == 0 and g0 == 0 and bool(fused.any()) else None
                loss_metrics += self.accumulate(batch.select(rows), tc.micro_batch_size, old_logprobs_into=fill)
                if self.acc.sync_gradients:
                    gn = self.strategy.clip_grad_norm_(self.model, tc.max_grad_norm)
                    grad_norms.append(gn)
                    if not math.isfinite(gn):  # the same on every rank: gradients are all-reduced
                        skipped += 1  # a NaN/inf step would poison the weights and the optimizer's moments
                        self.opt.zero_grad(set_to_none=True)
                        continue
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        t_update = t2 - t1 - t_old
        weights_ok = self._weights_finite()
        if weights_ok:
            self.push_weights()
        if self.producer is not None:
            self.producer.step_done()  # rollout may run one step further
        t_push = time.perf_counter() - t2
        t_total = time.perf_counter() - t0

        metrics = self.step_metrics(groups, batch, loss_metrics)
        metrics.update({f"train/{k}": float(v) for k, v in batch_metrics.items()})
        metrics.update(self.algorithm.rollout_metrics(groups, self.reduce_sum))  # e.g. ARPO's trees
        metrics.update(resample_metrics)
        if self.rt.agent is not None:  # endpoint requests, prefix breaks and errors, summed over processes
            agent_m = self.rt.agent.metrics()
            sums = self.reduce_sum(torch.tensor(list(agent_m.values()), dtype=torch.float64))
            metrics.update(zip(agent_m, sums.tolist()))
        metrics.update(
            {
                # the step itemized; advantages, collation and metrics are the rest of step_s
                "time/rollout_s": t_roll,
                "time/old_logprobs_s": t_old,  # recompute under the sampling weights (and the reference's)
                "time/update_s": t_update,  # forward, backward and optimizer steps
                "time/push_s": t_push,  # the finiteness check and the weight push to the policy
                "time/step_s": t_total,
                "train/grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
                "train/lr": float(self.sched.get_last_lr()[0]),
                "train/skipped_updates": float(skipped),
                "train/weights_finite": float(weights_ok),
            }
        )
        metrics.update(self._async_metrics(staleness, dropped, t_roll, metrics))
        return metrics

    def _async_metrics(self, staleness: list[int], dropped: int, t_roll: float, m: dict[str, float]) -> dict[str, float]:
        """Staleness of this batch, dropped groups, and over the run so far: the share of wall time the trainer
        waited for data and the engines waited for work (no group in flight), and generated tokens per second."""
        clock = self._run_clock
        clock["wait_s"] += t_roll
        clock["tokens"] += m["rollout/gen_tokens_per_group"] * len(staleness) * self.acc.num_processes  # all ranks
        clock["dropped"] += dropped
        wall = max(time.perf_counter() - clock["start"], 1e-9)
        if self.producer is not None:
            idle = self.producer.engine_idle_s() / max(self.producer.elapsed_s(), 1e-9)
        else:  # synchronous: the engines work only while the trainer waits for the rollout
            idle = 1.0 - min(clock["wait_s"] / wall, 1.0)
        return {
            "async/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
            "async/staleness_max": float(max(staleness, default=0)),
            "async/dropped_groups": float(dropped),
            "async/dropped_total": clock["dropped"],
            "time/trainer_wait_frac": min(clock["wait_s"] / wall, 1.0),
            "time/engine_idle_frac": idle,
            "time/tokens_per_s": clock["tokens"] / wall,
        }

    def accumulate(
        self, mb: TrainBatch, micro_batch_size: int, old_logprobs_into: tuple[TrainBatch, torch.Tensor] | None = None
    ) -> list[dict[str, float]]:
        """Gradients of one mini-batch (this rank's rows), in micro-batches; returns each one's loss metrics.

        Each micro-batch's loss is divided by the whole mini-batch's counts
        (`loss_norm`), so their sum, which backward accumulates, is the
        mini-batch's loss whatever the micro-batch size; gradients are
        all-reduced across ranks on the last micro-batch. `old_logprobs_into`
        (the step's batch, and the rows `mb` holds): the forward's logprobs are
        the old ones (no optimizer step yet), written there and used as such.
        """
        norm = self.loss_norm(mb.loss_mask)
        micro = chunks(len(mb), micro_batch_size)
        metrics = []
        for mi, s in enumerate(micro):
            part = mb.select(s).trimmed().to(self.acc.device)
            with self.strategy.no_sync(self.model, last=mi == len(micro) - 1):
                new_lp = token_logprobs(
                    self.model, part.input_ids, part.attention_mask, self.cfg.policy.temperature, pack=self.pack
                )
                if old_logprobs_into is not None:
                    part.old_logprobs = new_lp.detach().float() * part.loss_mask
                    batch, rows = old_logprobs_into
                    batch.old_logprobs[rows[s], : new_lp.shape[1]] = part.old_logprobs.cpu()
                loss, m = self.algorithm.loss(part, new_lp, norm=norm)
                self.acc.backward(loss)  # summed over micro-batches, not averaged
            metrics.append(m)
        self._idle_passes(mb, len(micro), backward=True)
        return metrics

    def _update_yields_old_logprobs(self, model: torch.nn.Module) -> bool:
        """Whether the update's first mini-batch supplies its rows' old logprobs, instead of a recompute.

        Its forward runs before any optimizer step of the step, so under the
        weights the recompute would use; it qualifies when that forward is the
        recompute's: no dropout active in train mode (the model's, LoRA's), and
        no reference model (an algorithm with a KL term may read old minus
        reference logprobs in `finalize`, before any update: REINFORCE++'s KL in
        the return). Every algorithm otherwise (GRPO, ARPO, DAPO, GSPO, any
        `trainer.ppo_epochs`, `trainer.max_staleness`, world size, packing); with
        one mini-batch a step (`mini_batch_tasks` = `tasks_per_step`) no recompute is left.
        """
        dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
        attention_dropout = float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0)
        return self.ref_model is None and not dropout and attention_dropout == 0.0

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over every process (a collective: each process calls it alike)."""
        if self.acc.num_processes == 1:
            return t
        return self.acc.reduce(t.to(self.acc.device), reduction="sum").to(t.device)

    def loss_norm(self, loss_mask: torch.Tensor) -> LossNorm:
        """A mini-batch's policy tokens and sequences summed over all ranks (each rank holds its share)."""
        local = LossNorm.of(loss_mask)
        counts = torch.tensor([local.tokens, local.sequences], dtype=torch.float64, device=self.acc.device)
        tokens, sequences = self.acc.reduce(counts, reduction="sum").cpu().tolist()
        return LossNorm(tokens=tokens, sequences=sequences, world=self.acc.num_processes)

    def _weights_finite(self) -> bool:
        """Every parameter finite, on every rank (one reduced flag; shards are checked where they live)."""
        bad = sum(int(not torch.isfinite(sharding.local(p)).all()) for p in self.model.parameters())
        flag = torch.tensor([float(bad)], device=self.acc.device)
        return float(self.acc.reduce(flag, reduction="sum").item()) == 0.0

    def check_health(self, step: int, metrics: dict[str, float]) -> None:
        """Stop a run that can no longer learn, with the reason; called after each step is logged.

        Raises:
            TrainingStopped: Every trajectory failed in `trainer.max_failed_steps`
                consecutive steps; the loss or gradient was not finite in
                `trainer.nonfinite_patience` consecutive steps; or the weights
                are no longer finite (at once: nothing after this can be saved).
        """
        tc = self.cfg.trainer
        last = ckpt.latest_checkpoint(self.out)
        saved = f"the last checkpoint is {last}" if last is not None else "no checkpoint was written"
        if not metrics["train/weights_finite"]:
            raise TrainingStopped(
                f"the weights stopped being finite at step {step} (trainer.lr={tc.lr:g}, trainer.max_grad_norm="
                f"{tc.max_grad_norm:g}); lower trainer.lr. Nothing was saved from this step; {saved}"
            )
        n = metrics["rollout/trajectories"]
        all_failed = n > 0 and metrics["rollout/failed"] >= n
        self._failed_streak = self._failed_streak + 1 if all_failed else 0
        if self._failed_streak >= tc.max_failed_steps:
            common = self.last_errors.most_common(1)
            why = f"{common[0][0]!r} ({common[0][1]} of {sum(self.last_errors.values())})" if common else "unknown"
            raise TrainingStopped(
                f"every trajectory failed in {self._failed_streak} consecutive steps (up to step {step}; "
                f"trainer.max_failed_steps={tc.max_failed_steps}). Most common error on this process: {why}. "
                f"Fix its cause, or raise trainer.max_failed_steps to ride out a longer outage; {saved}"
            )
        stats = self.last_tool_stats
        for tool in sorted(self.rt.tools):
            most_failed = stats.calls[tool] > 0 and stats.failure_share(tool) > 0.5
            self._tool_streak[tool] = self._tool_streak[tool] + 1 if most_failed else 0
            if self._tool_streak[tool] >= tc.max_failed_steps:
                kind, n, text = stats.commonest(tool) or ("error", 0, "")
                raise TrainingStopped(
                    f"the {tool} tool failed most of its calls in {self._tool_streak[tool]} consecutive steps (up to "
                    f"step {step}: {stats.failures(tool)} of {stats.calls[tool]} in the last; trainer.max_failed_steps="
                    f"{tc.max_failed_steps}); commonest: {kind}" + (f": {text}" if text else "")
                    + f". Fix the tool (env.tools.{tool}) or its cause; {saved}"
                )
        loss_keys = [k for k in metrics if k.startswith("train/") and "loss" in k]
        nonfinite = metrics["train/skipped_updates"] > 0 or any(not math.isfinite(metrics[k]) for k in loss_keys)
        self._nonfinite_streak = self._nonfinite_streak + 1 if nonfinite else 0
        if self._nonfinite_streak >= tc.nonfinite_patience:
            raise TrainingStopped(
                f"the loss or gradient norm was not finite in {self._nonfinite_streak} consecutive steps (up to step "
                f"{step}; trainer.nonfinite_patience={tc.nonfinite_patience}); their updates were skipped. "
                f"Lower trainer.lr ({tc.lr:g}) or check the data; {saved}"
            )

    def step_metrics(self, groups: list[Group], batch: TrainBatch, loss_metrics: list[dict[str, float]]) -> dict[str, float]:
        """Sums reduced across ranks, then turned into means."""
        trajs = [t for g in groups for t in g]
        mask = batch.loss_mask
        ent = torch.tensor([h for t in trajs for s in t.segments if s.source == "policy" for h in cast(list[float], s.entropies)])
        ent = ent[torch.isfinite(ent)]
        gap = (batch.old_logprobs - batch.sampler_logprobs).abs() * mask
        # sampler vs trainer: k3 estimate of KL(sampler || trainer) over the sampled tokens, and the largest
        # importance ratio pi_trainer / pi_sampler (what `algorithm.rollout_correction` caps)
        mismatch = kl_k3(batch.sampler_logprobs.double(), batch.old_logprobs.double(), mask)
        log_rho = (batch.old_logprobs - batch.sampler_logprobs).masked_fill(mask == 0, -math.inf)
        rewards, correct = episode_outcomes(trajs)
        sums = {
            "n_traj": float(len(trajs)),
            "n_episodes": float(len(rewards)),
            "n_groups": float(len(groups)),
            "reward": sum(rewards),
            "correct": sum(correct),
            "tool_calls": float(sum(t.num_tool_calls for t in trajs)),
            # tool results the env produced: a tree's shared prefixes count once (the paper's tool-call budget)
            "tool_results": float(sum(own_tool_results(t) for t in trajs)),
            # tokens the sampler generated: a tree's shared prefixes count once
            "gen_tokens": float(sum(self.algorithm.generated_tokens(g) for g in groups)),
            "failed": float(sum(t.failed for t in trajs)),
            "entropy_sum": float(ent.sum()) if ent.numel() else 0.0,
            "entropy_n": float(ent.numel()),
            "gap_sum": float(gap.sum()),
            "gap_n": float(mask.sum()),
            "gap_max": float(gap.max()) if gap.numel() else 0.0,
            "mismatch_kl": float(mismatch.sum()),
            "loss_n": float(len(loss_metrics)),
        }
        tool_names = sorted(self.rt.tools)  # the same on every process: the keys must match to be summed
        local_tools = ToolStats.of(trajs)
        sums.update(local_tools.counts(tool_names))
        sums.update(reward_error_counts(trajs))  # every kind, on every process: the keys must match
        keys = sorted({k for m in loss_metrics for k in m})
        for k in keys:
            sums[f"loss/{k}"] = float(sum(m.get(k, 0.0) for m in loss_metrics))
        names = sorted(sums)
        vec = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=self.acc.device)
        total = dict(zip(names, self.acc.reduce(vec, reduction="sum").cpu().tolist()))
        rho_max = float(log_rho.max()) if log_rho.numel() else -math.inf
        maxes = self.acc.gather(torch.tensor([[sums["gap_max"], rho_max]], dtype=torch.float64, device=self.acc.device))
        gap_max, rho_max = maxes.max(dim=0).values.tolist()
        n = max(total["n_traj"], 1.0)
        out = {
            "rollout/reward": total["reward"] / max(total["n_episodes"], 1.0),  # by episode, as the group's statistics
            "rollout/accuracy": total["correct"] / max(total["n_episodes"], 1.0),
            "rollout/tool_calls_per_traj": total["tool_calls"] / n,
            "rollout/gen_tokens_per_group": total["gen_tokens"] / max(total["n_groups"], 1.0),
            "rollout/tool_results_per_group": total["tool_results"] / max(total["n_groups"], 1.0),
            "rollout/failed": total["failed"],
            "rollout/trajectories": total["n_traj"],
            "rollout/episodes": total["n_episodes"],
            "rollout/entropy": total["entropy_sum"] / max(total["entropy_n"], 1.0),
            "train/logprob_gap_mean": total["gap_sum"] / max(total["gap_n"], 1.0),
            "train/logprob_gap_max": gap_max,
            "train/mismatch_kl": total["mismatch_kl"] / max(total["gap_n"], 1.0),
            # no policy token: 1; a ratio past float64 (a -inf sampler logprob): inf
            "train/is_ratio_max": 1.0 if rho_max == -math.inf else float(torch.tensor(rho_max, dtype=torch.float64).exp()),
        }
        for k in keys:
            out[f"train/{k}"] = total[f"loss/{k}"] / max(total["loss_n"], 1.0)
        self.last_tool_stats = ToolStats.from_counts(
            {k: v for k, v in total.items() if k.startswith(("tool_calls/", "tool_errors/"))}, local_tools.examples
        )
        out.update(self.last_tool_stats.metrics("rollout/", tool_names))
        out.update({f"rollout/{k}": v for k, v in total.items() if k.startswith("reward_errors/")})
        return out

    # ------------------------------------------------------------------ eval and checkpoints
    def check_tools(self) -> None:
        """Every tool warm and answering (`Runtime.health_check`), on every process, before anything is measured.

        Raises:
            ToolError: A tool did not pass its check (the run stops with that one line).
        """
        self.run(self.rt.health_check())
        self.acc.wait_for_everyone()

    def warn_tools(self, stats: ToolStats, where: str) -> None:
        """One warning line per tool that failed more than a fifth of its calls (main process)."""
        if self.acc.is_main_process:
            for line in stats.warnings(where):
                print(f"[train] warning: {line}", file=sys.stderr, flush=True)

    def evaluate(self, n_tasks: int | None = None, step: int = 0) -> EvalReport | None:
        """Held-out evaluation on the main process (others wait); warns of tools that failed in it."""
        tc = self.cfg.trainer
        report = None
        heldout = balanced_subset(self.rt.tasks.heldout, n_tasks or tc.eval_tasks)
        if self.acc.is_main_process and heldout:
            params = self.cfg.policy.sampling_params(temperature=tc.eval_temperature)
            report = self.run(
                evaluate(
                    self.rt.policy, self.rt.make_env, heldout,
                    samples=tc.eval_samples, params=params, seed=tc.evaluation_seed, rollout=self.cfg.rollout,
                    sampler=self.rt.agent_sampler(tc.eval_samples),
                )  # fmt: skip
            )
            self.warn_tools(report.tool_stats, f"in the evaluation at step {step}")
            if self.rollout_log is not None:
                self.rollout_log.evaluation(step, report.groups)
        self.acc.wait_for_everyone()
        return report

    def save(self, step: int) -> Path:
        """Write checkpoint `step` into a staging folder, then rename it into place (complete or absent)."""
        final = ckpt.checkpoint_dir(self.out, step)
        staging = ckpt.staging_dir(self.out, step)
        if self.acc.is_main_process:
            ckpt.begin(self.out, step)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(staging))
        self.strategy.save(self.model, self.opt, staging, self.rt.tokenizer)
        self.acc.wait_for_everyone()  # every rank's RNG state and shards are written
        stream, pending = self.stream.state_dict(), []
        if self.producer is not None:  # the groups drawn and not trained on: regenerated from their seeds on resume
            drawn, next_seq = self.producer.snapshot()
            stream = {**stream, "cursor": next_seq}
            pending = [[p.seq, p.task.id, p.attempt] for p in drawn]
        if self.acc.is_main_process:
            state = {"step": step, "stream": stream, "pending": pending, "time": time.time()}
            ckpt.write_state(staging, state)
            ckpt.finalize(staging, final)
            ckpt.prune(self.out, self.cfg.trainer.keep_checkpoints)
        self.acc.wait_for_everyone()
        return final

    # ------------------------------------------------------------------ loop
    def train(self) -> TrainResult:
        tc = self.cfg.trainer
        progress = _progress(self.cfg.logging.progress and self.acc.is_main_process)
        initial = None
        final = None
        try:  # a tool that fails its check or a broken first evaluation still closes the tools and the engine
            self.check_tools()
            if self.start_step == 0 and tc.eval_every > 0:
                initial = self.evaluate()
                if initial and self.logger:
                    self.logger.log(0, initial.as_metrics())
            self._run_clock = {"start": time.perf_counter(), "wait_s": 0.0, "tokens": 0.0, "dropped": 0.0}
            if self.asynchronous and self.start_step < tc.steps:
                self.producer = self._start_producer()
            with progress:
                task_id = progress.add_task("train", total=tc.steps, completed=self.start_step)
                for step in range(self.start_step, tc.steps):
                    metrics = self.train_step(step)
                    done = step + 1
                    self.warn_tools(self.last_tool_stats, f"in step {done}")
                    if tc.eval_every > 0 and done % tc.eval_every == 0 and done < tc.steps:
                        rep = self.evaluate(step=done)
                        if rep:
                            metrics.update(rep.as_metrics())
                    if self.logger:
                        self.logger.log(done, metrics)
                        with (self.out / "batches.jsonl").open("a") as f:
                            f.write(json.dumps({"step": done, "tasks": self.last_batch_ids}) + "\n")
                    self.check_health(done, metrics)  # before a checkpoint could save what is broken
                    if done % tc.checkpoint_every == 0 or done == tc.steps:
                        self.save(done)
                    progress.update(task_id, advance=1, description=_describe(metrics))
            self._stop_producer()  # the groups beyond the last step are not trained on
            final = self.evaluate(step=tc.steps)
            if final and self.logger:
                self.logger.log(tc.steps, final.as_metrics())
                (self.out / "eval.json").write_text(json.dumps(final.to_json(), indent=1, default=str))
        finally:
            self.close()
        return TrainResult(tc.steps, self.out, final, initial)

    def _stop_producer(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def close(self) -> None:
        if self.logger:
            self.logger.close()
            self.logger = None
        if self.rollout_log is not None:
            self.rollout_log.close()
            self.rollout_log = None
        if not self.loop.is_closed():
            try:
                self._stop_producer()
                self.run(self.rt.aclose())
            finally:
                if self._loop_thread is not None:
                    self._loop_thread.stop()
                else:
                    self.loop.close()
        self.engine_log.close()  # after the engine's shutdown, which logs too


def _broadcast_path(path: Path | None) -> Path | None:
    """The main process's choice, on every rank (ranks must resume from the same checkpoint)."""
    from accelerate.utils import broadcast_object_list

    box = [str(path) if path is not None else None]
    broadcast_object_list(box)
    return Path(box[0]) if box[0] is not None else None


def _describe(metrics: dict[str, float]) -> str:
    """The progress bar's text: reward, accuracy and the last step's seconds itemized (rollout, old logprobs,
    update, push); with the bar, the count and the clock it fits an 80-column terminal."""
    return (
        f"r={metrics['rollout/reward']:.2f} acc={metrics['rollout/accuracy']:.2f} | "
        f"roll {metrics['time/rollout_s']:.1f} lp {metrics['time/old_logprobs_s']:.1f} "
        f"upd {metrics['time/update_s']:.1f} push {metrics['time/push_s']:.1f} s"
    )


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=12), MofNCompleteColumn(), TimeElapsedColumn(), disable=not enabled
    )


def train(cfg: RunConfig, *, resume: bool = False) -> TrainResult:
    """Build a Trainer for `cfg` and run it to `trainer.steps`."""
    return Trainer(cfg, resume=resume).train()
