"""The hf backend on a CUDA device: batched sampling whose logprobs and entropies equal the model's own
scoring on the GPU, and weight pushes that take effect and bump the version. Run where a GPU is lent."""

from __future__ import annotations

import pytest
import torch

from agentenv.training.scoring import sequence_logprobs
from agentenv.types import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def cuda_policy(small_tokenizer):
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig

    from .conftest import make_small_model

    model = make_small_model(len(small_tokenizer)).to("cuda")
    return HFPolicy(HFPolicyConfig(model="<in-memory>", device="cuda"), model=model, tokenizer=small_tokenizer)


def _prompt(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cuda_batch_logprobs_and_entropies_match_scoring(cuda_policy, small_tokenizer, temperature):
    assert cuda_policy.device.type == "cuda" and next(cuda_policy.model.parameters()).is_cuda
    prompts = [_prompt(small_tokenizer, t) for t in ["the", "quick brown fox jumps over the", "lazy dog 0123"]]
    gens = cuda_policy.generate_many_sync(prompts, SamplingParams(max_tokens=16, temperature=temperature, seed=9))
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs], device="cuda")
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device="cuda")
    with torch.no_grad():
        lp, ent = sequence_logprobs(cuda_policy.model, ids, mask, temperature)
    for i, g in enumerate(gens):
        n = len(g.token_ids)
        assert n > 0 and g.versions == [0] * n
        torch.testing.assert_close(lp[i, -n:].cpu(), torch.tensor(g.logprobs), atol=1e-4, rtol=0)
        torch.testing.assert_close(ent[i, -n:].cpu(), torch.tensor(g.entropies), atol=1e-4, rtol=0)


def test_cuda_load_weights_from_cpu_tensors(cuda_policy, small_tokenizer):
    from .conftest import make_small_model

    prompt = _prompt(small_tokenizer, "quick brown fox")
    params = SamplingParams(max_tokens=12, temperature=0.0)
    before = cuda_policy.generate_sync(prompt, params)
    other = make_small_model(len(small_tokenizer), seed=1)  # on the CPU, as a trainer's gathered state dict is
    cuda_policy.load_weights((f"module.{k}", v) for k, v in other.state_dict().items())
    after = cuda_policy.generate_sync(prompt, params)
    assert cuda_policy.weight_version == 1 and after.versions == [1] * len(after.token_ids)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    with torch.no_grad():
        lp, _ = sequence_logprobs(other, torch.tensor([prompt + after.token_ids]))
    torch.testing.assert_close(lp[0, len(prompt) - 1 :], torch.tensor(after.logprobs), atol=1e-4, rtol=0)


def test_cuda_next_turns_over_kept_caches_prefill_together_and_report_the_models_scoring(cuda_policy, small_tokenizer):
    """Three agents' next turns on the GPU, each over the cache its last turn left there: the three prefill in
    one forward, and every logprob and entropy reported is the model's own scoring of the whole context."""
    tok = small_tokenizer
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=3, include_eos=True)
    texts = ("the quick brown fox", "a lazy dog sleeps in the warm sun all day long", "one two three four five six")
    ctxs, stats = [_prompt(tok, t) for t in texts], cuda_policy.stats
    for turn in range(3):
        calls, hits = stats.prefill_calls, stats.prefix_hits
        gens = cuda_policy.generate_many_sync(ctxs, params)
        if turn:
            assert (stats.prefill_calls, stats.prefix_hits) == (calls + 1, hits + 3)
        assert all(k.is_cuda for p in cuda_policy._kept.caches.values() for k, _ in p.kv)
        for ctx, g in zip(ctxs, gens):
            n = len(g.token_ids)
            with torch.no_grad():
                lp, ent = sequence_logprobs(
                    cuda_policy.model, torch.tensor([ctx + g.token_ids], device="cuda"), None, 1.0
                )
            torch.testing.assert_close(lp[0, -n:].cpu(), torch.tensor(g.logprobs), atol=1e-4, rtol=0)
            torch.testing.assert_close(ent[0, -n:].cpu(), torch.tensor(g.entropies), atol=1e-4, rtol=0)
        ctxs = [
            ctx + g.token_ids + _prompt(tok, " result" + " 7" * i + " .") for i, (ctx, g) in enumerate(zip(ctxs, gens))
        ]
