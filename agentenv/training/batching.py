"""Trajectories -> padded tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentenv.algorithms.base import TrainBatch
from agentenv.types import Trajectory


def collate(
    trajectories: Sequence[Trajectory], advantages: Sequence[torch.Tensor], pad_id: int
) -> TrainBatch:
    """Right-pad trajectories into a TrainBatch (old_logprobs still equal the sampler's).

    Column t of the per-token tensors describes token t + 1, the one the model
    predicts from the first t + 1 tokens.
    """
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantage rows")
    B = len(trajectories)
    L = max(2, max(len(t) for t in trajectories))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L - 1))
    adv = torch.zeros((B, L - 1))
    sampler_lp = torch.zeros((B, L - 1))
    for i, (traj, a) in enumerate(zip(trajectories, advantages)):
        n = len(traj)
        if a.shape[0] != n:
            raise ValueError(f"trajectory {traj.uid} has {n} tokens but {a.shape[0]} advantages")
        if n == 0:
            continue
        input_ids[i, :n] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        m = torch.tensor(traj.loss_mask[1:], dtype=torch.float32)  # (n-1,)
        loss_mask[i, : n - 1] = m
        adv[i, : n - 1] = a[1:].float() * m
        lp = torch.tensor(traj.logprobs[1:], dtype=torch.float32)
        sampler_lp[i, : n - 1] = torch.nan_to_num(lp) * m
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        advantages=adv,
        old_logprobs=sampler_lp.clone(),
        sampler_logprobs=sampler_lp,
    )


def chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]
