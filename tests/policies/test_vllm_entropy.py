"""vLLM policy pieces that need no engine: config validation, the top-k entropy estimator."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv.errors import ConfigError
from agentenv.policies.vllm import VLLMPolicyConfig, exact_entropy, topk_entropy


def test_config_defaults_and_validation_name_key_and_value():
    cfg = VLLMPolicyConfig(model="m")
    assert cfg.enable_prefix_caching and cfg.entropy_mode == "topk" and cfg.entropy_topk == 20
    with pytest.raises(ConfigError, match=r"policy.entropy_topk.*0"):
        VLLMPolicyConfig(model="m", entropy_topk=0)
    with pytest.raises(ConfigError, match=r"policy.entropy_mode.*'full'"):
        VLLMPolicyConfig(model="m", entropy_mode="full")
    with pytest.raises(ConfigError, match=r"policy.gpu_memory_utilization.*1.5"):
        VLLMPolicyConfig(model="m", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match=r"policy.tensor_parallel_size.*0"):
        VLLMPolicyConfig(model="m", tensor_parallel_size=0)
    with pytest.raises(ConfigError, match=r"policy.dtype.*'int8'"):
        VLLMPolicyConfig(model="m", dtype="int8")
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
