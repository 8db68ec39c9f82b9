"""The Accelerate trainer: roll out, score, advantages, update, push weights, log, checkpoint.

One code path for one CPU process, DDP or FSDP2 (`trainer.strategy`, see
`sharding`) on CPU processes or GPUs, and several nodes (`accelerate launch` /
`torchrun`). Each rank rolls out its own share of every batch; Accelerate
all-reduces the gradients; metrics are reduced across ranks. The trainer only
trains: a step's groups come from its batch source (`batches`: synchronous, or
asynchronous within a staleness bound), sampling is the algorithm's sampler,
advantages and the loss are the algorithm's pure functions; the step's metrics
(`metrics`), the run's health (`health`) and checkpoints (`checkpoint`) live in
modules of their own.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentenv.algorithms import get_algorithm
from agentenv.algorithms.base import Algorithm
from agentenv.configs import RunConfig
from agentenv.errors import ConfigError, InfraError
from agentenv.policies.models import resolve_model_path
from agentenv.tasks.task import balanced_subset
from agentenv.training import sharding
from agentenv.training.async_rollout import group_versions
from agentenv.training.batches import AsyncBatches, BatchSource, RolloutLoop, Rollouts, SyncBatches
from agentenv.training.batching import collate
from agentenv.training.build import Runtime, build_runtime, check_output_dir, first_line
from agentenv.training.checkpoint import Checkpointer
from agentenv.training.data import TaskStream
from agentenv.training.engine_log import EngineLog
from agentenv.training.evaluate import EvalReport, evaluate
from agentenv.training.health import HealthMonitor
from agentenv.training.metrics import MetricsLogger, describe, progress_bar, reduce_sum, step_metrics
from agentenv.training.packing import packing_enabled
from agentenv.training.rollout_log import RolloutLog
from agentenv.training.schedule import adamw
from agentenv.training.update import Updater, update_yields_old_logprobs

T = TypeVar("T")


@dataclass
class TrainResult:
    steps: int
    output_dir: Path
    final_eval: EvalReport | None
    initial_eval: EvalReport | None


class Trainer:
    """Trains `cfg.model` with `cfg.algorithm` on `cfg.env`.

    Args:
        cfg: The validated run config.
        resume: Continue from the newest complete checkpoint in `trainer.output_dir`.
        accelerator: An `accelerate.Accelerator` (one is made if None).
        runtime: Prebuilt tools/policy/tasks (built from cfg if None).
        async_rollout: Roll out through the asynchronous producer
            (`agentenv.training.batches.AsyncBatches`); None: when `trainer.max_staleness`
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
        asynchronous = tc.max_staleness >= 1 if async_rollout is None else async_rollout
        if asynchronous:
            AsyncBatches.check(cfg, self.algorithm, world)
        # Asynchronous: the rollout's loop runs in its own thread, so rollout goes on while this thread updates.
        self.loop = RolloutLoop(threaded=asynchronous)

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
        self.rollouts = Rollouts(cfg, self.rt, self.algorithm)
        self.batches: BatchSource = (AsyncBatches if asynchronous else SyncBatches)(
            self.rollouts, self.stream, self.acc, self.loop
        )
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        updates_per_step = tc.ppo_epochs * (tc.tasks_per_step // tc.mini_batch_tasks)
        self.total_updates = max(1, tc.steps * updates_per_step)
        # shared prefixes once in recompute and update (auto: for algorithms that grow trees)
        pack = packing_enabled(tc.pack_prefixes, model, trees=self.algorithm.grows_trees)
        fuse = update_yields_old_logprobs(model, self.ref_model)
        self.strategy = sharding.Strategy(self.acc, tc.strategy, cfg.model.lora)
        self.model, self.opt, self.sched = self.strategy.prepare(model, *adamw(tc, self.total_updates))
        if hasattr(self.sched, "split_batches"):  # Accelerate's wrapper (not under fsdp2, which keeps the bare one)
            # Accelerate steps a scheduler once per process per call (it assumes per-process batches); an
            # update here is global (a mini-batch spans every process): one step, or the schedule runs `world` x fast.
            self.sched.split_batches = True
        self.updater = Updater(cfg, self.acc, self.strategy, self.model, self.opt, self.sched, self.algorithm,
                               self.ref_model, pack, fuse)  # fmt: skip
        self.pad_id = self._pad_id()
        self.checkpointer = Checkpointer(
            self.out, self.acc, self.strategy, self.model, self.opt, self.rt.tokenizer, tc.keep_checkpoints
        )
        self.health = HealthMonitor(tc, list(self.rt.tools), self.out, self.acc.is_main_process)
        self.last_batch_ids: list[str] = []
        self.start_step = 0
        self.resumed_from: Path | None = None
        self.resume_skipped: list[tuple[Path, str]] = []  # newer checkpoints found damaged, with why
        if resume:
            self.resumed_from, state, self.resume_skipped = self.checkpointer.resume(self.batches.load_state_dict)
            self.start_step = int(state.get("step", 0))
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

    # ------------------------------------------------------------------ helpers
    def _pad_id(self) -> int:
        tok = self.rt.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def unwrapped(self) -> torch.nn.Module:
        model: torch.nn.Module = self.acc.unwrap_model(self.model)
        return model

    def push_weights(self) -> None:
        """Send the trainer's weights to the rollout policy, one full tensor at a time (gathered, LoRA merged)."""
        self.rt.policy.load_weights(sharding.full_weights(self.unwrapped()))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the rollout loop and wait for it."""
        return self.loop.run(coro)

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over every process (a collective: each process calls it alike)."""
        return reduce_sum(self.acc, t)

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> dict[str, float]:
        tc = self.cfg.trainer
        t0 = time.perf_counter()
        taken = self.batches.next(step)
        groups, version = taken.groups, taken.version
        self.last_batch_ids = taken.task_ids
        # weight versions behind the trainer's, per group: the policy's lag, <= trainer.max_staleness on every batch
        staleness = [version - group_versions(g, version)[0] for g in groups]
        if any(not 0 <= s <= tc.max_staleness for s in staleness):
            raise InfraError(f"a batch broke the staleness bound {tc.max_staleness}: {staleness} (trainer version {version})")
        t_roll = time.perf_counter() - t0

        trajs, advs, group_of = [], [], []
        for gi, g in enumerate(groups):
            for traj, a in zip(g.trajectories, self.algorithm.advantages(g)):
                trajs.append(traj)
                advs.append(a)
                group_of.append(gi)
        batch = collate(trajs, advs, self.pad_id)
        t1 = time.perf_counter()
        group_idx = torch.tensor(group_of)
        fused = self.updater.score(batch, group_idx)  # old (and reference) logprobs
        t_old = time.perf_counter() - t1
        batch_metrics = self.algorithm.finalize(batch, trajs, self.reduce_sum)  # batch-level advantages
        if self.rollout_log is not None:
            self.rollout_log.train_step(step + 1, groups, trajs, batch)
        loss_metrics, update_metrics = self.updater.update(batch, group_idx, len(groups), fused)
        t2 = time.perf_counter()
        t_update = t2 - t1 - t_old
        weights_ok = self.updater.weights_finite()
        if weights_ok:
            self.push_weights()
        self.batches.step_done()  # asynchronous: rollout may run one step further
        t_push = time.perf_counter() - t2
        t_total = time.perf_counter() - t0

        metrics, tool_stats = step_metrics(groups, batch, loss_metrics, self.algorithm, sorted(self.rt.tools), self.acc)
        self.health.record(groups, tool_stats)
        metrics.update({f"train/{k}": float(v) for k, v in batch_metrics.items()})
        metrics.update(self.algorithm.rollout_metrics(groups, self.reduce_sum))  # e.g. ARPO's trees
        metrics.update(taken.metrics)
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
                **update_metrics,  # grad_norm, lr, skipped_updates
                "train/weights_finite": float(weights_ok),
            }
        )
        metrics.update(self.batches.flow_metrics(staleness, taken.dropped, t_roll, metrics))
        return metrics

    # ------------------------------------------------------------------ eval and checkpoints
    def check_tools(self) -> None:
        """Every tool warm and answering (`Runtime.health_check`), on every process, before anything is measured.

        Raises:
            ToolError: A tool did not pass its check (the run stops with that one line).
        """
        self.run(self.rt.health_check())
        self.acc.wait_for_everyone()

    def evaluate(self, n_tasks: int | None = None, step: int = 0, temperature: float | None = None) -> EvalReport | None:
        """Held-out evaluation on the main process (others wait); warns of tools that failed in it.

        `temperature`: None for `trainer.eval_temperature`.
        """
        tc = self.cfg.trainer
        report = None
        heldout = balanced_subset(self.rt.tasks.heldout, n_tasks or tc.eval_tasks)
        if self.acc.is_main_process and heldout:
            params = self.cfg.policy.sampling_params(temperature=tc.eval_temperature if temperature is None else temperature)
            report = self.run(
                evaluate(
                    self.rt.policy, self.rt.make_env, heldout,
                    samples=tc.eval_samples, params=params, seed=tc.evaluation_seed, rollout=self.cfg.rollout,
                    sampler=self.rt.agent_sampler(tc.eval_samples),
                )  # fmt: skip
            )
            self.health.warn_tools(report.tool_stats, f"in the evaluation at step {step}")
            if self.rollout_log is not None:
                self.rollout_log.evaluation(step, report.groups)
        self.acc.wait_for_everyone()
        return report

    def save(self, step: int) -> Path:
        """Checkpoint `step` (`Checkpointer.save`), with the batch source's data cursor and groups in flight."""
        return self.checkpointer.save(step, self.batches.state_dict)

    # ------------------------------------------------------------------ loop
    def train(self) -> TrainResult:
        tc = self.cfg.trainer
        progress = progress_bar(self.cfg.logging.progress and self.acc.is_main_process)
        initial = None
        final = None
        try:  # a tool that fails its check or a broken first evaluation still closes the tools and the engine
            self.check_tools()
            if self.start_step == 0 and tc.eval_every > 0:
                initial = self.evaluate()
                if initial and self.logger:
                    self.logger.log(0, initial.as_metrics())
            self.batches.restart_clock()
            if self.start_step < tc.steps:
                self.batches.start()
            with progress:
                task_id = progress.add_task("train", total=tc.steps, completed=self.start_step)
                for step in range(self.start_step, tc.steps):
                    metrics = self.train_step(step)
                    done = step + 1
                    self.health.warn_tools(self.health.tool_stats, f"in step {done}")
                    if tc.eval_every > 0 and done % tc.eval_every == 0 and done < tc.steps:
                        rep = self.evaluate(step=done)
                        if rep:
                            metrics.update(rep.as_metrics())
                    if self.logger:
                        self.logger.log(done, metrics)
                        with (self.out / "batches.jsonl").open("a") as f:
                            f.write(json.dumps({"step": done, "tasks": self.last_batch_ids}) + "\n")
                    self.health.check(done, metrics)  # before a checkpoint could save what is broken
                    if done % tc.checkpoint_every == 0 or done == tc.steps:
                        self.save(done)
                    progress.update(task_id, advance=1, description=describe(metrics))
            self.batches.stop()  # the groups beyond the last step are not trained on
            final = self.evaluate(step=tc.steps)
            greedy = self.evaluate(step=tc.steps, temperature=0.0) if tc.eval_greedy and tc.eval_temperature > 0 else None
            if final and self.logger:
                self.logger.log(tc.steps, {**final.as_metrics(), **(greedy.as_metrics("eval_greedy/") if greedy else {})})
                record = final.to_json() | ({"greedy": greedy.to_json()} if greedy else {})
                (self.out / "eval.json").write_text(json.dumps(record, indent=1, default=str))
        finally:
            self.close()
        return TrainResult(tc.steps, self.out, final, initial)

    def close(self) -> None:
        if self.logger:
            self.logger.close()
            self.logger = None
        if self.rollout_log is not None:
            self.rollout_log.close()
            self.rollout_log = None
        if not self.loop.closed:
            try:
                self.batches.stop()
                self.run(self.rt.aclose())
            finally:
                self.loop.close()
        self.engine_log.close()  # after the engine's shutdown, which logs too


def train(cfg: RunConfig, *, resume: bool = False) -> TrainResult:
    """Build a Trainer for `cfg` and run it to `trainer.steps`."""
    return Trainer(cfg, resume=resume).train()
