"""The loss's normalizer, off-policy correction and KL term, on tensors small enough to check by hand."""

import math

import pytest
import torch

from agentenv.algorithms import register
from agentenv.algorithms.base import LossNorm, TrainBatch
from agentenv.algorithms.core import aggregate, kl_k3, rollout_weights
from agentenv.algorithms.grpo import GRPO, GRPOConfig
from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError

L = math.log


def batch_of(mask, old, sampler=None, advantages=None, ref=None) -> TrainBatch:
    mask = torch.tensor(mask, dtype=torch.float32)
    B, T = mask.shape
    old = torch.tensor(old, dtype=torch.float32)
    return TrainBatch(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        loss_mask=mask,
        advantages=torch.ones(B, T) * mask if advantages is None else torch.tensor(advantages),
        old_logprobs=old,
        sampler_logprobs=old.clone() if sampler is None else torch.tensor(sampler, dtype=torch.float32),
        ref_logprobs=None if ref is None else torch.tensor(ref, dtype=torch.float32),
    )


# --------------------------------------------------------------------------- off-policy correction
# rho = pi_old / pi_sampler: row 0 has rho = [1, 4, 0.5, (masked) 4.5]; row 1 is a failed trajectory.
OLD = [[L(0.5), L(0.4), L(0.2), L(0.9)], [L(0.3), L(0.3), L(0.3), L(0.3)]]
SAMPLER = [[L(0.5), L(0.1), L(0.4), L(0.2)], [L(0.9), L(0.9), L(0.9), L(0.9)]]
MASK = [[1, 1, 1, 0], [0, 0, 0, 0]]


def weights(mode, level, cap):
    w, over = rollout_weights(torch.tensor(OLD), torch.tensor(SAMPLER), torch.tensor(MASK), mode, level, cap)
    return [[round(v, 5) for v in row] for row in w.tolist()], over.tolist()


def test_token_level_tis_truncates_and_mis_drops_ratios_above_the_cap():
    w, over = weights("tis", "token", 2.0)
    assert w[0][:3] == [1.0, 2.0, 0.5]  # min(rho, 2)
    assert over[0] == [False, True, False, False]
    w, over = weights("mis", "token", 2.0)
    assert w[0][:3] == [1.0, 0.0, 0.5]  # rho where rho <= 2, else 0
    assert over[0] == [False, True, False, False]
    # a failed row (no policy token) is never flagged; masked weights are neutral
    assert over[1] == [False] * 4 and w[1] == [1.0] * 4
    w, over = weights("none", "token", 2.0)
    assert w == [[1.0] * 4, [1.0] * 4] and over[0] == [False, True, False, False]


def test_sequence_level_weighs_every_token_by_the_product_of_its_rows_ratios():
    # the product over row 0's policy tokens: 1 * 4 * 0.5 = 2 (the masked 4.5 is left out)
    w, over = weights("tis", "sequence", 3.0)
    assert w[0][:3] == [2.0] * 3 and over[0] == [False] * 4
    w, over = weights("tis", "sequence", 1.5)
    assert w[0][:3] == [1.5] * 3 and over[0] == [True, True, True, False]
    w, _ = weights("mis", "sequence", 1.5)
    assert w[0][:3] == [0.0] * 3  # the whole trajectory is dropped
    w, _ = weights("mis", "sequence", 3.0)
    assert w[0][:3] == [2.0] * 3


def test_a_huge_sequence_ratio_does_not_overflow():
    old = torch.zeros(1, 200)
    sampler = torch.full((1, 200), -5.0)  # rho = e^5 per token, e^1000 over the sequence
    for mode, want in (("tis", 2.0), ("mis", 0.0)):
        w, over = rollout_weights(old, sampler, torch.ones(1, 200), mode, "sequence", 2.0)
        assert torch.isfinite(w).all() and w.unique().tolist() == [want] and over.all()


def test_tis_weighs_each_tokens_policy_gradient():
    # new = old: ratio 1, advantages 1, so d loss / d new_t = -w_t / (policy tokens = 3)
    b = batch_of(MASK, OLD, SAMPLER)
    for mode, w in (("none", [1.0, 1.0, 0.5]), ("tis", [1.0, 2.0, 0.5]), ("mis", [1.0, 0.0, 0.5])):
        w = [1.0, 1.0, 1.0] if mode == "none" else w
        new = b.old_logprobs.clone().requires_grad_(True)
        cfg = GRPOConfig(group_size=2, rollout_correction=mode, rollout_correction_cap=2.0)
        loss, metrics = GRPO(cfg).loss(b, new)
        loss.backward()
        assert new.grad[0, :3].tolist() == pytest.approx([-x / 3 for x in w], abs=1e-6), mode
        assert new.grad[0, 3] == 0 and new.grad[1].abs().sum() == 0
        if mode != "none":
            assert metrics["is_capped_frac"] == pytest.approx(1 / 3)
            assert metrics["is_weight_mean"] == pytest.approx(sum(w) / 3)
        else:
            assert "is_weight_mean" not in metrics


# --------------------------------------------------------------------------- the KL term


def test_kl_term_is_finite_where_a_masked_token_is_very_unlikely():
    # A tool token (masked) the policy finds very unlikely (-95), and the reference's 0 there (the
    # trainer leaves masked positions at 0): exp(0 - (-95)) overflows float32, inf * 0 = NaN.
    new = torch.tensor([[-2.0, -95.0, -1.0]], requires_grad=True)
    b = batch_of([[1, 0, 1]], [[-2.0, -95.0, -1.0]], advantages=[[0.0, 0.0, 0.0]], ref=[[-2.5, 0.0, -1.5]])
    loss, metrics = GRPO(GRPOConfig(group_size=2, kl_coef=0.1)).loss(b, new)
    loss.backward()
    k3 = math.exp(-0.5) + 0.5 - 1.0  # d = ref - new = -0.5 at both policy tokens
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)
    assert metrics["kl"] == pytest.approx(k3, rel=1e-5)
    assert torch.isfinite(new.grad).all() and new.grad[0, 1] == 0
    # d/dnew of 0.1 * (e^d - d - 1) / 2 = 0.1 * (1 - e^d) / 2
    assert new.grad[0, 0].item() == pytest.approx(0.1 * (1 - math.exp(-0.5)) / 2, rel=1e-5)
    assert kl_k3(new.detach(), b.ref_logprobs, b.loss_mask).tolist()[0][1] == 0.0


# --------------------------------------------------------------------------- normalizing over the mini-batch
PER = torch.tensor(
    [[1.0, 2.0, 3.0, 4.0], [5.0, 0.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0], [2.0, 4.0, 0.0, 0.0], [9.0, 1.0, 1.0, 0.0]]
)
NMASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])  # row 2 failed


def test_loss_norm_counts_tokens_and_rows_with_a_token():
    norm = LossNorm.of(NMASK)
    assert (norm.tokens, norm.sequences, norm.world) == (10.0, 4.0, 1)
    assert LossNorm(10.0, 4.0, world=2).token_denominator == 5.0
    assert LossNorm(0.0, 0.0).token_denominator == 1.0  # an all-failed mini-batch: a zero loss, not 0/0


@pytest.mark.parametrize("mode,want", [("token_mean", 32 / 10), ("seq_mean_token_mean", (2.5 + 5 + 3 + 11 / 3) / 4)])
def test_micro_batch_losses_add_up_to_the_mini_batch_mean(mode, want):
    assert aggregate(PER, NMASK, mode).item() == pytest.approx(want)
    norm = LossNorm.of(NMASK)
    for splits in ([slice(0, 5)], [slice(i, i + 1) for i in range(5)], [slice(0, 2), slice(2, 3), slice(3, 5)]):
        total = sum(aggregate(PER[s], NMASK[s], mode, norm).item() for s in splits)
        assert total == pytest.approx(want), splits
    # each micro-batch normalized on its own and averaged (the old scheme) is another number
    old = sum(aggregate(PER[i : i + 1], NMASK[i : i + 1], mode).item() for i in range(5)) / 5
    assert old != pytest.approx(want)
    # two processes, each with its rows and the shared count; DDP averages their gradients
    norm2 = LossNorm(norm.tokens, norm.sequences, world=2)
    ranks = [aggregate(PER[r::2], NMASK[r::2], mode, norm2).item() for r in (0, 1)]
    assert sum(ranks) / 2 == pytest.approx(want)


# --------------------------------------------------------------------------- config


def test_correction_options_are_validated_with_the_dotted_key():
    with pytest.raises(ConfigError, match=r"algorithm.rollout_correction: must be one of 'none', 'tis', 'mis', got 'is'"):
        config_from_dict({"algorithm": {"name": "grpo", "rollout_correction": "is"}})
    with pytest.raises(ConfigError, match="algorithm.rollout_correction_level"):
        config_from_dict({"algorithm": {"name": "arpo", "rollout_correction_level": "geometric"}})
    for bad in (1.0, 0.5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"algorithm.rollout_correction_cap: must be a finite number > 1"):
            GRPOConfig(rollout_correction="tis", rollout_correction_cap=bad)
    with pytest.raises(ConfigError, match=r"algorithm.kl_coef: must be a finite number >= 0, got nan"):
        GRPOConfig(kl_coef=float("nan"))
    cfg = config_from_dict({"algorithm": {"name": "arpo", "rollout_correction": "mis", "rollout_correction_cap": 3}})
    assert cfg.algorithm_config.rollout_correction == "mis" and cfg.algorithm_config.rollout_correction_cap == 3.0


class _OldStyleLoss(GRPO):
    def loss(self, batch, new_logprobs):  # type: ignore[override]
        return super().loss(batch, new_logprobs)


def test_a_plugin_whose_loss_ignores_the_normalizer_is_refused_by_name(monkeypatch):
    from agentenv.algorithms import _REGISTRY

    monkeypatch.setattr(_REGISTRY, "_entries", dict(_REGISTRY._entries))  # registered for this test only
    register("old_style_loss_test", _OldStyleLoss, overwrite=True)
    with pytest.raises(ConfigError, match=r"algorithm.name: .*must also take `norm`"):
        config_from_dict({"algorithm": {"name": "old_style_loss_test"}})
