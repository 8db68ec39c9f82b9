"""Scoring sequences for the update: per-token logprobs and entropies under the trained model.

The trainer's side of the sampler/trainer agreement: the same distribution the
policies report (`agentenv.policies.distribution`), recomputed with gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from agentenv.policies.distribution import logprobs_and_entropy


def sequence_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score given sequences under `softmax(logits / T)`.

    Works with left or right padding: position ids are derived from the mask.
    Keeps the autograd graph (the trainer differentiates through it).

    Args:
        model: A causal LM (`model(input_ids, attention_mask, position_ids).logits`).
        input_ids: (B, T) token ids.
        attention_mask: (B, T), 1 on real tokens; None means all ones.
        temperature: T; 0 (greedy) is scored at T = 1, as the sampler reports it.

    Returns:
        (logprobs, entropies), each (B, T-1): `logprobs[b, t]` is the
        log-probability of `input_ids[b, t+1]` given `input_ids[b, :t+1]`, and
        `entropies[b, t]` the entropy (nats) of that next-token distribution.
        Values at padded positions are meaningless; mask them.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, :-1].float()  # (B, T-1, V): predicts token t+1
    logp, ent = logprobs_and_entropy(logits, temperature)  # (B, T-1, V), (B, T-1)
    token_logp = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return token_logp, ent
