"""One step's policy update: old (and reference) logprobs, then mini-batches of micro-batches, one optimizer step each.

The trainer collates a step's groups into a `TrainBatch` and hands it here:
`score` fills in the logprobs the loss compares against, `update` runs
`trainer.ppo_epochs` passes of mini-batches of whole groups, each micro-batch's
loss divided by its mini-batch's counts over every process (`loss_norm`), so
the accumulated gradient is the mini-batch's whatever the micro-batch size.
Under fsdp2 every forward is a collective: a process with fewer micro-batches
runs empty ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from agentenv.algorithms.base import Algorithm, LossNorm, TrainBatch
from agentenv.configs import RunConfig
from agentenv.training import sharding
from agentenv.training.batching import chunks
from agentenv.training.scoring import token_logprobs

if TYPE_CHECKING:
    from accelerate import Accelerator


def update_yields_old_logprobs(model: torch.nn.Module, ref_model: torch.nn.Module | None) -> bool:
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
    return ref_model is None and not dropout and attention_dropout == 0.0


class Updater:
    """The policy update of a step (this process's rows).

    Args:
        cfg: The run config (`trainer`'s batch sizes and clipping, `policy.temperature`).
        acc: The `accelerate.Accelerator`.
        strategy: How the model is spread over the processes.
        model, opt, sched: The prepared model, optimizer and learning-rate schedule.
        algorithm: Its `loss` is what each micro-batch minimizes.
        ref_model: The reference model, when the algorithm needs one.
        pack: Compute the prefixes a micro-batch's rows share once (`agentenv.training.packing`).
        fuse_old_logprobs: The first mini-batch's forward supplies its rows' old logprobs (`update_yields_old_logprobs`).
    """

    def __init__(self, cfg: RunConfig, acc: Accelerator, strategy: sharding.Strategy, model: torch.nn.Module,
                 opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
                 algorithm: Algorithm, ref_model: torch.nn.Module | None, pack: bool, fuse_old_logprobs: bool):  # fmt: skip
        self.cfg = cfg
        self.acc = acc
        self.strategy = strategy
        self.model = model
        self.opt = opt
        self.sched = sched
        self.algorithm = algorithm
        self.ref_model = ref_model
        self.pack = pack
        self.fuse_old_logprobs = fuse_old_logprobs

    def score(self, batch: TrainBatch, group_idx: torch.Tensor) -> torch.Tensor:
        """Fill in `batch.old_logprobs` (and `ref_logprobs`); returns the rows (bool, (B,)) whose old logprobs the
        update's first mini-batch supplies instead (they stay 0 until then). `group_idx`: (B,) each row's group."""
        tasks_per_mb = self.cfg.trainer.mini_batch_tasks // self.acc.num_processes
        # the first mini-batch's forward, before any optimizer step, is under the weights the recompute would use
        fused = (group_idx < tasks_per_mb) if self.fuse_old_logprobs else torch.zeros(len(batch), dtype=torch.bool)
        self.model.eval()
        batch.old_logprobs = self.recompute(batch, self.acc.unwrap_model(self.model), rows=~fused)
        if self.ref_model is not None:
            batch.ref_logprobs = self.recompute(batch, self.ref_model)
        self.model.train()
        return fused

    @torch.no_grad()
    def recompute(self, batch: TrainBatch, model: torch.nn.Module, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logprobs of the batch under `model`, in micro-batches: (B, T); only `rows` (bool, (B,)) when given
        (the others stay 0: the update's first mini-batch fills its own, `update_yields_old_logprobs`)."""
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

    def update(
        self, batch: TrainBatch, group_idx: torch.Tensor, n_groups: int, fused: torch.Tensor
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """This rank's `n_groups` groups, split into mini-batches of whole groups, one optimizer update each,
        `trainer.ppo_epochs` times. Returns each micro-batch's loss metrics, and the updates' own (gradient norm,
        learning rate, updates skipped for a gradient that was not finite).

        `group_idx`: (B,) each row's group; `fused`: (B,) the rows whose old
        logprobs the first mini-batch's forward supplies (`score`, `accumulate`).
        """
        tc = self.cfg.trainer
        tasks_per_mb = tc.mini_batch_tasks // self.acc.num_processes
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        skipped = 0  # updates whose gradient norm was not finite
        for epoch in range(tc.ppo_epochs):
            for g0 in range(0, n_groups, tasks_per_mb):
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
        return loss_metrics, {
            "train/grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
            "train/lr": float(self.sched.get_last_lr()[0]),
            "train/skipped_updates": float(skipped),
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

    def loss_norm(self, loss_mask: torch.Tensor) -> LossNorm:
        """A mini-batch's policy tokens and sequences summed over all ranks (each rank holds its share)."""
        local = LossNorm.of(loss_mask)
        counts = torch.tensor([local.tokens, local.sequences], dtype=torch.float64, device=self.acc.device)
        tokens, sequences = self.acc.reduce(counts, reduction="sum").cpu().tolist()
        return LossNorm(tokens=tokens, sequences=sequences, world=self.acc.num_processes)

    def weights_finite(self) -> bool:
        """Every parameter finite, on every rank (one reduced flag; shards are checked where they live)."""
        bad = sum(int(not torch.isfinite(sharding.local(p)).all()) for p in self.model.parameters())
        flag = torch.tensor([float(bad)], device=self.acc.device)
        return float(self.acc.reduce(flag, reduction="sum").item()) == 0.0
