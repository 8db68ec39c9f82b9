"""Sequence scoring for the update: padding-invariant, differentiable, the samplers' distribution."""

from __future__ import annotations

import math

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentenv.envs.testing import build_test_tokenizer
from agentenv.policies.distribution import logprobs_and_entropy
from agentenv.training.scoring import sequence_logprobs


def small_model(vocab_size: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256)  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def test_padding_invariant_and_differentiable():
    tok = build_test_tokenizer()
    model = small_model(len(tok))
    seq = tok.encode("the quick brown fox jumps", add_special_tokens=False)
    n = len(seq)
    solo_lp, solo_ent = sequence_logprobs(model, torch.tensor([seq]))
    left = torch.tensor([[0, 0, 0] + seq])
    left_mask = torch.tensor([[0, 0, 0] + [1] * n])
    right = torch.tensor([seq + [0, 0, 0]])
    right_mask = torch.tensor([[1] * n + [0, 0, 0]])
    llp, _ = sequence_logprobs(model, left, left_mask, 1.0)
    rlp, rent = sequence_logprobs(model, right, right_mask, 1.0)
    torch.testing.assert_close(llp[:, 3:], solo_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(rlp[:, : n - 1], solo_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(rent[:, : n - 1], solo_ent, atol=1e-5, rtol=0)
    assert solo_lp.shape == (1, n - 1) and solo_lp.requires_grad
    solo_lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_the_distribution_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4) at T = 1
    logp, ent = logprobs_and_entropy(logits, 1.0)
    torch.testing.assert_close(logp.exp(), torch.tensor([[0.25, 0.75]]))
    want = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert abs(ent.item() - want) < 1e-6
    # greedy (T = 0) is reported at T = 1; T = 2 halves the logits
    assert torch.equal(logprobs_and_entropy(logits, 0.0)[0], logp)
    torch.testing.assert_close(logprobs_and_entropy(logits, 2.0)[0], torch.log_softmax(logits / 2, -1))
