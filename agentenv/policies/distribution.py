"""The distribution a policy samples from and reports on, shared by every sampler and the trainer.

`softmax(logits / T)` (T = temperature; greedy is reported at T = 1): the hf
backend samples from it and reports the logprob and exact entropy of each
token; the trainer scores sequences under it (`agentenv.training.scoring`), so
the two agree to float rounding.
"""

from __future__ import annotations

import torch


def logprobs_and_entropy(logits: torch.Tensor, temperature: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax of `logits / T` over the last dim and its exact entropy.

    Args:
        logits: (..., V), any float dtype (computed in float32, or float64 for float64 logits).
        temperature: A float, or a tensor broadcastable to `logits[..., :1]`;
            zeros are read as 1 (greedy is reported at T = 1).

    Returns:
        (logp (..., V), entropy (...)).
    """
    logp = scaled_log_softmax(logits, temperature)
    p = logp.exp()
    # p == 0 only where logp == -inf (masked logits); 0 * -inf would be nan.
    ent = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return logp, ent


def scaled_log_softmax(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """Log-softmax of `logits / T` over the last dim, in float32 or wider (a float64 model is scored in float64)
    (`logprobs_and_entropy` without the entropy: four more passes over (..., V) when only the sampled tokens'
    logprobs are wanted)."""
    t: torch.Tensor | float
    if isinstance(temperature, torch.Tensor):
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
    else:
        t = float(temperature) if temperature > 0 else 1.0
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(wide / t, dim=-1)
