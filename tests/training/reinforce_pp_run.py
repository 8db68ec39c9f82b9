"""Under torchrun, REINFORCE++'s batch step on each rank's own hand-built rows, reduced by the real trainer.

Run as `torchrun --nproc_per_node 2 reinforce_pp_run.py RUN.yaml OUT_DIR`: rank r holds `rows(r)` (rank 0
high rewards and long rows, rank 1 low rewards and short ones), calls the algorithm's `finalize` with
`Trainer.reduce_sum`, and saves its advantages and mask. `rows` is also what the test feeds one process.
"""

import sys
from pathlib import Path

import torch
import yaml

from agentenv.algorithms.base import TrainBatch
from agentenv.algorithms.presets import ReinforcePP, ReinforcePPConfig

KL_COEF = 0.1


def rows(rank: int) -> TrainBatch:
    """Rank 0: rewards around 1, 6 rows of up to 9 policy tokens; rank 1: rewards around 0, 3 rows of up to 4."""
    gen = torch.Generator().manual_seed(10 + rank)
    B, T = (6, 10) if rank == 0 else (3, 5)
    mask = torch.zeros(B, T)
    for i in range(B):
        n = int(torch.randint(2, T, (), generator=gen))
        mask[i, 1:n] = 1.0
    mask[:, 2] = 0.0  # a tool token in every row
    rewards = (1.0 if rank == 0 else 0.0) + 0.3 * torch.randn(B, generator=gen)
    old = -torch.rand(B, T, generator=gen) * mask
    ref = -torch.rand(B, T, generator=gen) * mask
    return TrainBatch(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        loss_mask=mask,
        advantages=rewards[:, None] * mask,  # the estimator's scalar (the outcome reward), broadcast
        old_logprobs=old,
        sampler_logprobs=old.clone(),
        ref_logprobs=ref,
    )


def algorithm() -> ReinforcePP:
    return ReinforcePP(ReinforcePPConfig(group_size=2, kl_coef=KL_COEF))


if __name__ == "__main__":
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    trainer = Trainer(config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text())))
    try:
        rank = trainer.acc.process_index
        batch = rows(rank)
        metrics = algorithm().finalize(batch, [None] * len(batch), trainer.reduce_sum)
        torch.save(
            {"world": trainer.acc.num_processes, "advantages": batch.advantages, "mask": batch.loss_mask, **metrics},
            Path(sys.argv[2]) / f"rank{rank}.pt",
        )
    finally:
        trainer.close()
