"""A hand-built mini-batch of uneven trajectories (two failed), and, under torchrun, each rank's gradient of its rows.

Run as `torchrun --nproc_per_node 2 loss_norm_run.py RUN.yaml OUT_DIR`: rank r takes rows r, r + 2, ...
(so ranks hold different numbers of policy tokens), accumulates them one trajectory per micro-batch,
and saves the gradient DDP leaves on it for each loss aggregation, and how far one update moves
the learning-rate schedule.
"""

import sys
from pathlib import Path

import torch
import yaml

from agentenv.algorithms.base import TrainBatch
from agentenv.algorithms.grpo import GRPO, GRPOConfig

LENGTHS = [12, 40, 7, 25, 3, 33, 18, 9]
FAILED = {2, 5}  # rows whose trajectory failed: no policy token


def hand_batch(trainer) -> TrainBatch:
    """Rows of LENGTHS tokens: 2 prompt tokens, then policy tokens with a 3-token tool result in longer rows."""
    gen = torch.Generator().manual_seed(0)
    vocab = trainer.unwrapped().config.vocab_size
    B, L = len(LENGTHS), max(LENGTHS)
    ids = torch.full((B, L), trainer.pad_id, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L - 1)
    adv = torch.zeros(B, L - 1)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(0, vocab, (n,), generator=gen)
        attention[i, :n] = 1
        if i in FAILED:
            continue
        mask[i, 1 : n - 1] = 1.0  # column t predicts token t + 1: tokens 2..n-1 are the policy's
        if n > 10:
            mask[i, 5:8] = 0.0  # a tool result
        adv[i] = torch.randn((), generator=gen) * mask[i]
    batch = TrainBatch(ids, attention, mask, adv, torch.zeros(B, L - 1), torch.zeros(B, L - 1))
    batch.old_logprobs = trainer.updater.recompute(batch, trainer.unwrapped())
    batch.sampler_logprobs = batch.old_logprobs.clone()
    return batch


def gradients(trainer, batch: TrainBatch, micro_batch_size: int) -> dict[str, torch.Tensor]:
    """For each aggregation: the flat gradient `Updater.accumulate` leaves for `batch`."""
    out = {}
    for agg in ("token_mean", "seq_mean_token_mean"):
        trainer.updater.algorithm = GRPO(GRPOConfig(group_size=2, loss_agg=agg))
        trainer.opt.zero_grad(set_to_none=True)
        trainer.updater.accumulate(batch, micro_batch_size)
        out[agg] = torch.cat([p.grad.detach().flatten().cpu() for p in trainer.unwrapped().parameters()])
    trainer.opt.zero_grad(set_to_none=True)
    return out


if __name__ == "__main__":
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    trainer = Trainer(config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text())))
    try:
        rank, world = trainer.acc.process_index, trainer.acc.num_processes
        batch = hand_batch(trainer)
        mine = batch.select(torch.arange(rank, len(batch), world))
        grads = gradients(trainer, mine, micro_batch_size=1)
        trainer.opt.step()  # one optimizer update, as the trainer makes it
        trainer.sched.step()
        scheduler_steps = trainer.sched.scheduler.last_epoch
        torch.save(
            {"world": world, "tokens": float(mine.loss_mask.sum()), "scheduler_steps": scheduler_steps, **grads},
            Path(sys.argv[2]) / f"rank{rank}.pt",
        )
    finally:
        trainer.close()
