"""REINFORCE++ normalizes advantages over the global batch: on two processes (torchrun, gloo) holding different
reward distributions, the advantages after `finalize` have mean 0 and std 1 over both processes' policy
tokens together (not per process), and equal those of one process holding every row."""

from __future__ import annotations

import pytest
import torch

from agentenv.algorithms.base import TrainBatch
from agentenv.configs import config_from_dict


def _one_process(run, batches: list[TrainBatch]) -> torch.Tensor:
    """Every rank's rows in one batch (padded to the widest), through the same finalize: (B, T)."""
    T = max(b.loss_mask.shape[1] for b in batches)
    pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]))  # noqa: E731
    cat = TrainBatch(
        input_ids=torch.zeros(sum(len(b) for b in batches), T + 1, dtype=torch.long),
        attention_mask=torch.ones(sum(len(b) for b in batches), T + 1, dtype=torch.long),
        loss_mask=torch.cat([pad(b.loss_mask) for b in batches]),
        advantages=torch.cat([pad(b.advantages) for b in batches]),
        old_logprobs=torch.cat([pad(b.old_logprobs) for b in batches]),
        sampler_logprobs=torch.cat([pad(b.sampler_logprobs) for b in batches]),
        ref_logprobs=torch.cat([pad(b.ref_logprobs) for b in batches]),
    )
    run.algorithm().finalize(cat, [None] * len(cat), lambda t: t)
    return cat.advantages


@pytest.mark.slow
def test_two_processes_whiten_over_the_global_batch(fast_overrides, run_ranks, script_module, tmp_path):
    run = script_module("reinforce_pp_run")
    cfg = config_from_dict({}, fast_overrides + ["algorithm.name=reinforce_pp", f"algorithm.kl_coef={run.KL_COEF}"])
    ranks = run_ranks("reinforce_pp_run.py", cfg, tmp_path)
    assert ranks[0]["world"] == 2
    values = [r["advantages"][r["mask"] > 0].double() for r in ranks]
    both = torch.cat(values)
    assert both.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert both.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # per process they are far from whitened: rank 0 held the high rewards, rank 1 the low ones
    assert values[0].mean() > 0.2 and values[1].mean() < -0.5
    assert ranks[0]["return_mean"] == ranks[1]["return_mean"] and ranks[0]["return_std"] == ranks[1]["return_std"]
    # the same numbers as one process holding every row
    one = _one_process(run, [run.rows(0), run.rows(1)])
    n0 = len(run.rows(0))
    for r, rows in ((0, slice(0, n0)), (1, slice(n0, None))):
        got = ranks[r]["advantages"]
        assert torch.allclose(got, one[rows, : got.shape[1]], atol=1e-5)
