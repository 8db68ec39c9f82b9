"""The Accelerate trainer: roll out, score, advantages, update, push weights, log, checkpoint.

One code path for one CPU process, DDP/FSDP/DeepSpeed on GPUs and several
nodes (`accelerate launch` / `torchrun`). Each rank rolls out its own share of
every batch; Accelerate all-reduces the gradients; metrics are reduced across
ranks. The trainer only orchestrates: sampling is the algorithm's sampler,
advantages and the loss are the algorithm's pure functions.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentenv.algorithms import get_algorithm
from agentenv.algorithms.arpo.tree import group_generated_tokens
from agentenv.algorithms.base import TrainBatch
from agentenv.configs import RunConfig
from agentenv.training import checkpoint as ckpt
from agentenv.policies.hf import sequence_logprobs
from agentenv.rollout import derive_seed
from agentenv.tasks.task import balanced_subset
from agentenv.training.batching import chunks, collate
from agentenv.training.build import Runtime, build_runtime, resolve_model_path
from agentenv.training.data import TaskStream
from agentenv.training.engine_log import EngineLog
from agentenv.training.evaluate import EvalReport, evaluate
from agentenv.training.metrics import MetricsLogger
from agentenv.types import Group, SamplingParams


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
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, accelerator: Any = None, runtime: Runtime | None = None):
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        tc = cfg.trainer
        world = self.acc.num_processes
        if tc.tasks_per_step % world or tc.mini_batch_tasks % world:
            raise ValueError(
                f"trainer.tasks_per_step {tc.tasks_per_step} and trainer.mini_batch_tasks {tc.mini_batch_tasks} "
                f"must be divisible by the number of processes {world}"
            )
        set_seed(tc.seed)
        self.out = Path(tc.output_dir)
        self.loop = asyncio.new_event_loop()

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
            model = AutoModelForCausalLM.from_pretrained(self.rt.model_path, dtype=dtype)
            self.ref_model = None
            if getattr(cfg.algorithm_config, "kl_coef", 0.0) > 0:
                self.ref_model = AutoModelForCausalLM.from_pretrained(self.rt.model_path, dtype=dtype).eval()
                self.ref_model.requires_grad_(False)
                self.ref_model.to(self.acc.device)
        self.algorithm = get_algorithm(cfg.algorithm.name)(cfg.algorithm_config)
        self.stream = TaskStream(self.rt.tasks.train, seed=tc.seed)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
        updates_per_step = tc.ppo_epochs * (tc.tasks_per_step // tc.mini_batch_tasks)
        total = max(1, tc.steps * updates_per_step)
        warm = tc.warmup_steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm > 0 else 1.0)
        self.total_updates = total
        self.model, self.opt, self.sched = self.acc.prepare(model, opt, sched)
        self.pad_id = self._pad_id()
        self.start_step = 0
        if resume:
            last = ckpt.latest_checkpoint(self.out)
            if last is not None:
                self.acc.load_state(str(last))
                state = ckpt.read_state(last)
                self.stream.load_state_dict(state["stream"])
                self.start_step = int(state["step"])
                self.resumed_from = last
        self.logger = MetricsLogger(self.out, cfg.logging, cfg.to_dict()) if self.acc.is_main_process else None
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
        self.push_weights()

    # ------------------------------------------------------------------ helpers
    def _pad_id(self) -> int:
        tok = self.rt.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def sampling_params(self, temperature: float | None = None) -> SamplingParams:
        p = self.cfg.policy
        return SamplingParams(
            max_tokens=p.max_turn_tokens,
            temperature=p.temperature if temperature is None else temperature,
            top_p=p.top_p,
            top_k=p.top_k,
        )

    def unwrapped(self) -> torch.nn.Module:
        return self.acc.unwrap_model(self.model)

    def push_weights(self) -> None:
        """Send the trainer's weights to the rollout policy."""
        state = self.unwrapped().state_dict()
        self.rt.policy.load_weights((k, v.detach()) for k, v in state.items())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # ------------------------------------------------------------------ one step
    async def rollout(self, tasks: list[Any], step: int, indices: list[int]) -> list[Group]:
        """One group per task; task `indices` (positions in the global batch) seed the samples."""
        sampler = self.algorithm.sampler()
        params = self.sampling_params()
        timeout = self.cfg.trainer.rollout_timeout_s * 4

        async def one(j: int, task: Any) -> Group:
            seed = derive_seed(self.cfg.trainer.seed, step, indices[j])
            return await asyncio.wait_for(sampler.sample(self.rt.policy, self.rt.make_env, task, params, seed), timeout)

        return list(await asyncio.gather(*(one(j, t) for j, t in enumerate(tasks))))

    @torch.no_grad()
    def recompute(self, batch: TrainBatch, model: torch.nn.Module) -> torch.Tensor:
        """Logprobs of the batch under `model`, in micro-batches: (B, T)."""
        out = torch.zeros_like(batch.old_logprobs)
        mb = self.cfg.trainer.micro_batch_size
        for s in chunks(len(batch), mb):
            part = batch.select(s).trimmed().to(self.acc.device)
            lp, _ = sequence_logprobs(model, part.input_ids, part.attention_mask, self.cfg.policy.temperature)
            out[s, : lp.shape[1]] = lp.float().cpu()  # columns past the trim stay 0 (padding)
        return out * batch.loss_mask

    def train_step(self, step: int) -> dict[str, float]:
        tc = self.cfg.trainer
        rank, world = self.acc.process_index, self.acc.num_processes
        t0 = time.perf_counter()
        tasks = self.stream.next_batch(tc.tasks_per_step)
        mine = tasks[rank::world]
        groups = self.run(self.rollout(mine, step, list(range(rank, len(tasks), world))))
        self.last_batch_ids = [t.id for t in tasks]
        t_roll = time.perf_counter() - t0

        trajs, advs, group_of = [], [], []
        for gi, g in enumerate(groups):
            for traj, a in zip(g.trajectories, self.algorithm.advantages(g)):
                trajs.append(traj)
                advs.append(a)
                group_of.append(gi)
        batch = collate(trajs, advs, self.pad_id)
        self.model.eval()
        batch.old_logprobs = self.recompute(batch, self.unwrapped())
        if self.ref_model is not None:
            batch.ref_logprobs = self.recompute(batch, self.ref_model)
        self.model.train()

        # updates: this rank's tasks split into mini-batches of whole groups
        tasks_per_mb = tc.mini_batch_tasks // world
        group_idx = torch.tensor(group_of)
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        for _ in range(tc.ppo_epochs):
            for g0 in range(0, len(groups), tasks_per_mb):
                rows = torch.nonzero((group_idx >= g0) & (group_idx < g0 + tasks_per_mb)).flatten()
                mb = batch.select(rows)
                micro = chunks(len(mb), tc.micro_batch_size)
                for mi, s in enumerate(micro):
                    part = mb.select(s).trimmed().to(self.acc.device)
                    last = mi == len(micro) - 1
                    ctx = self.acc.no_sync(self.model) if not last else _null()
                    with ctx:
                        new_lp, _ = sequence_logprobs(self.model, part.input_ids, part.attention_mask, self.cfg.policy.temperature)
                        loss, m = self.algorithm.loss(part, new_lp)
                        self.acc.backward(loss / len(micro))
                    loss_metrics.append(m)
                if self.acc.sync_gradients:
                    gn = self.acc.clip_grad_norm_(self.model.parameters(), tc.max_grad_norm)
                    grad_norms.append(float(gn))
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
        self.push_weights()
        t_total = time.perf_counter() - t0

        metrics = self.step_metrics(groups, batch, loss_metrics)
        metrics.update(
            {
                "time/rollout_s": t_roll,
                "time/step_s": t_total,
                "train/grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
                "train/lr": float(self.sched.get_last_lr()[0]),
            }
        )
        return metrics

    def step_metrics(self, groups: list[Group], batch: TrainBatch, loss_metrics: list[dict[str, float]]) -> dict[str, float]:
        """Sums reduced across ranks, then turned into means."""
        trajs = [t for g in groups for t in g]
        mask = batch.loss_mask
        ent = torch.tensor([h for t in trajs for s in t.segments if s.source == "policy" for h in s.entropies])
        ent = ent[torch.isfinite(ent)]
        gap = (batch.old_logprobs - batch.sampler_logprobs).abs() * mask
        sums = {
            "n_traj": float(len(trajs)),
            "n_groups": float(len(groups)),
            "reward": sum(t.reward for t in trajs),
            "correct": float(sum(t.correct for t in trajs)),
            "tool_calls": float(sum(t.num_tool_calls for t in trajs)),
            # tokens the sampler generated: a tree's shared prefixes count once
            "gen_tokens": float(sum(group_generated_tokens(g) for g in groups)),
            "failed": float(sum(t.failed for t in trajs)),
            "entropy_sum": float(ent.sum()) if ent.numel() else 0.0,
            "entropy_n": float(ent.numel()),
            "gap_sum": float(gap.sum()),
            "gap_n": float(mask.sum()),
            "gap_max": float(gap.max()) if gap.numel() else 0.0,
            "loss_n": float(len(loss_metrics)),
        }
        keys = sorted({k for m in loss_metrics for k in m})
        for k in keys:
            sums[f"loss/{k}"] = float(sum(m.get(k, 0.0) for m in loss_metrics))
        names = sorted(sums)
        vec = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=self.acc.device)
        total = dict(zip(names, self.acc.reduce(vec, reduction="sum").cpu().tolist()))
        gap_max = self.acc.gather(torch.tensor([sums["gap_max"]], device=self.acc.device)).max()
        n = max(total["n_traj"], 1.0)
        out = {
            "rollout/reward": total["reward"] / n,
            "rollout/accuracy": total["correct"] / n,
            "rollout/tool_calls_per_traj": total["tool_calls"] / n,
            "rollout/gen_tokens_per_group": total["gen_tokens"] / max(total["n_groups"], 1.0),
            "rollout/failed": total["failed"],
            "rollout/entropy": total["entropy_sum"] / max(total["entropy_n"], 1.0),
            "train/logprob_gap_mean": total["gap_sum"] / max(total["gap_n"], 1.0),
            "train/logprob_gap_max": float(gap_max.item()),
        }
        for k in keys:
            out[f"train/{k}"] = total[f"loss/{k}"] / max(total["loss_n"], 1.0)
        return out

    # ------------------------------------------------------------------ eval and checkpoints
    def evaluate(self, n_tasks: int | None = None) -> EvalReport | None:
        """Held-out evaluation on the main process (others wait)."""
        tc = self.cfg.trainer
        report = None
        heldout = balanced_subset(self.rt.tasks.heldout, n_tasks or tc.eval_tasks)
        if self.acc.is_main_process and heldout:
            params = self.sampling_params(temperature=tc.eval_temperature)
            report = self.run(
                evaluate(
                    self.rt.policy, self.rt.make_env, heldout,
                    samples=tc.eval_samples, params=params, seed=tc.evaluation_seed,
                )  # fmt: skip
            )
        self.acc.wait_for_everyone()
        return report

    def save(self, step: int) -> Path:
        d = ckpt.checkpoint_dir(self.out, step)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(d))
        if self.acc.is_main_process:
            model_dir = d / "model"
            self.unwrapped().save_pretrained(model_dir, safe_serialization=True)
            self.rt.tokenizer.save_pretrained(model_dir)
            ckpt.write_state(d, {"step": step, "stream": self.stream.state_dict(), "time": time.time()})
            ckpt.prune(self.out, self.cfg.trainer.keep_checkpoints)
        self.acc.wait_for_everyone()
        return d

    # ------------------------------------------------------------------ loop
    def train(self) -> TrainResult:
        tc = self.cfg.trainer
        progress = _progress(self.cfg.logging.progress and self.acc.is_main_process)
        initial = None
        if self.start_step == 0 and tc.eval_every > 0:
            initial = self.evaluate()
            if initial and self.logger:
                self.logger.log(0, initial.as_metrics())
        final = None
        try:
            with progress:
                task_id = progress.add_task("train", total=tc.steps, completed=self.start_step)
                for step in range(self.start_step, tc.steps):
                    metrics = self.train_step(step)
                    done = step + 1
                    if tc.eval_every > 0 and done % tc.eval_every == 0 and done < tc.steps:
                        rep = self.evaluate()
                        if rep:
                            metrics.update(rep.as_metrics())
                    if self.logger:
                        self.logger.log(done, metrics)
                        with (self.out / "batches.jsonl").open("a") as f:
                            f.write(json.dumps({"step": done, "tasks": self.last_batch_ids}) + "\n")
                    if done % tc.checkpoint_every == 0 or done == tc.steps:
                        self.save(done)
                    progress.update(
                        task_id, advance=1,
                        description=f"train r={metrics['rollout/reward']:.2f} acc={metrics['rollout/accuracy']:.2f}",
                    )
            final = self.evaluate()
            if final and self.logger:
                self.logger.log(tc.steps, final.as_metrics())
                (self.out / "eval.json").write_text(json.dumps(final.__dict__, indent=1, default=str))
        finally:
            self.close()
        return TrainResult(tc.steps, self.out, final, initial)

    def close(self) -> None:
        if self.logger:
            self.logger.close()
            self.logger = None
        if not self.loop.is_closed():
            self.run(self.rt.aclose())
            self.loop.close()
        self.engine_log.close()  # after the engine's shutdown, which logs too


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=not enabled
    )


def train(cfg: RunConfig, *, resume: bool = False) -> TrainResult:
    """Build a Trainer for `cfg` and run it to `trainer.steps`."""
    return Trainer(cfg, resume=resume).train()
