"""Scoring sequences for the update: per-token logprobs and entropies under the trained model.

The trainer's side of the sampler/trainer agreement: the same distribution the
policies report (`agentenv.policies.distribution`), recomputed with gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from agentenv.policies.distribution import logprobs_and_entropy, scaled_log_softmax
from agentenv.training.packing import PackPlan, additive_mask, check_packable, plan_packing

PACK_MIN_SAVING = 0.1
"""Below this fraction of tokens saved, `pack=True` computes the rows unpacked (the (P, P) mask costs more)."""


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    pack: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score given sequences under `softmax(logits / T)`.

    Works with left or right padding: position ids are derived from the mask.
    Keeps the autograd graph (the trainer differentiates through it).

    Args:
        model: A causal LM (`model(input_ids, attention_mask, position_ids).logits`).
        input_ids: (B, T) token ids.
        attention_mask: (B, T), 1 on real tokens; None means all ones.
        temperature: T; 0 (greedy) is scored at T = 1, as the sampler reports it.
        pack: Compute the prefixes that rows share once (`agentenv.training.packing`);
            the same values and gradients. Rows that share less than
            `PACK_MIN_SAVING` of their tokens are computed unpacked.

    Returns:
        (logprobs, entropies), each (B, T-1): `logprobs[b, t]` is the
        log-probability of `input_ids[b, t+1]` given `input_ids[b, :t+1]`, and
        `entropies[b, t]` the entropy (nats) of that next-token distribution.
        Values at padded positions are meaningless; mask them.
    """
    lp, ent = _score(model, input_ids, attention_mask, temperature, pack, entropy=True)
    assert ent is not None
    return lp, ent


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    pack: bool = False,
) -> torch.Tensor:
    """`sequence_logprobs`'s logprobs alone, (B, T-1): what the trainer's recompute and update use. The entropy
    (an exp, a product and a sum over every (position, vocabulary) pair) is not computed."""
    return _score(model, input_ids, attention_mask, temperature, pack, entropy=False)[0]


def _score(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, temperature: float, pack: bool,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if pack:
        plan = plan_packing(input_ids, attention_mask)
        if plan.saving >= PACK_MIN_SAVING:
            return _packed(model, plan, temperature, entropy)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, :-1]  # (B, T-1, V): predicts token t+1 (scored in float32 or wider)
    if entropy:
        logp, ent = logprobs_and_entropy(logits, temperature)  # (B, T-1, V), (B, T-1)
    else:
        logp, ent = scaled_log_softmax(logits, temperature), None
    token_logp = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return token_logp, ent


def packed_logprobs(model: Any, plan: PackPlan, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logprobs` of the rows a `PackPlan` packed: each shared token computed once.

    Returns:
        (logprobs, entropies), each (B, T) as the unpacked call gives them
        (padding columns hold a real position's values; mask them).
    """
    lp, ent = _packed(model, plan, temperature, entropy=True)
    assert ent is not None
    return lp, ent


def _packed(model: Any, plan: PackPlan, temperature: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_packable(model)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    mask = additive_mask(plan.allowed.to(device), dtype)  # (R, 1, P, P)
    logits = model(
        input_ids=plan.input_ids.to(device), attention_mask=mask, position_ids=plan.position_ids.to(device)
    ).logits  # (R, P, V)
    src = plan.src.to(device)  # (B, T)
    if entropy:
        logp, ent = logprobs_and_entropy(logits, temperature)  # (R, P, V), (R, P)
    else:
        logp, ent = scaled_log_softmax(logits, temperature), None
    token_logp = logp.flatten(0, 1)[src, plan.targets.to(device)]  # (B, T)
    return token_logp, (ent.flatten()[src] if ent is not None else None)
