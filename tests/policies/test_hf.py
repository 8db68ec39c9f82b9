"""HFPolicy mechanics on a very small random Qwen2: stops, EOS, length, logprobs, seeds, batching."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.policies.base import Policy
from agentenv.policies.hf import HFPolicy, HFPolicyConfig
from agentenv.training.scoring import sequence_logprobs
from agentenv.types import SamplingParams

from .conftest import make_small_model


def _prompt(tok, text="the quick brown fox"):
    return tok.encode(text)


def test_is_a_policy(small_policy):
    assert isinstance(small_policy, Policy)


def test_config_validation_names_key_and_value():
    with pytest.raises(ConfigError, match="policy.max_batch_size.*0"):
        HFPolicyConfig(model="m", max_batch_size=0)
    with pytest.raises(ConfigError, match="policy.device.*tpu"):
        HFPolicyConfig(model="m", device="tpu")
    with pytest.raises(ConfigError, match="policy.dtype"):  # a Literal: the loader checks it
        build_dataclass(HFPolicyConfig, {"model": "m", "dtype": "int8"}, "policy")


def test_length_finish(small_policy, small_tokenizer):
    g = small_policy.generate_sync(_prompt(small_tokenizer), SamplingParams(max_tokens=7, seed=3))
    assert g.finish_reason == "length" and g.stop_string is None
    assert len(g.token_ids) == len(g.logprobs) == len(g.entropies) == 7


def test_stop_string_keeps_its_tokens(small_policy, small_tokenizer):
    tok = small_tokenizer
    prompt = _prompt(tok)
    ref = small_policy.generate_sync(prompt, SamplingParams(max_tokens=30, seed=11))
    # A stop string spanning tokens 4..6 of the reference sample, cut inside token 6's text.
    head = tok.decode(ref.token_ids[:4])
    upto6 = tok.decode(ref.token_ids[:6])
    upto7 = tok.decode(ref.token_ids[:7])
    assert len(upto7) > len(upto6) + 0 and upto7.startswith(upto6)
    stop = upto7[len(head) : len(upto6) + 1]  # ends on the first char of token 7's text
    assert stop not in tok.decode(ref.token_ids[:6])
    g = small_policy.generate_sync(prompt, SamplingParams(max_tokens=30, seed=11, stop=("zzz-never", stop)))
    assert g.finish_reason == "stop"
    assert g.stop_string == stop
    assert g.token_ids == ref.token_ids[:7]  # token 7 completes the stop string and is kept
    assert g.logprobs == pytest.approx(ref.logprobs[:7], abs=1e-6)
    assert stop in tok.decode(g.token_ids)


def test_earliest_stop_string_wins(small_policy, small_tokenizer):
    tok = small_tokenizer
    prompt = _prompt(tok)
    for seed in range(5, 45):  # a sample whose late text does not already show in its first tokens
        ref = small_policy.generate_sync(prompt, SamplingParams(max_tokens=20, seed=seed))
        early = tok.decode(ref.token_ids[2:4])
        late = tok.decode(ref.token_ids[:12])[len(tok.decode(ref.token_ids[:10])) :]
        if len(ref.token_ids) == 20 and early and late and late not in tok.decode(ref.token_ids[:4]):
            break
    else:
        raise AssertionError("40 samples of 20 tokens all repeat their first tokens later")
    g = small_policy.generate_sync(prompt, SamplingParams(max_tokens=20, seed=seed, stop=(late, early)))
    assert g.stop_string == early
    assert len(g.token_ids) <= 4


def test_eos_kept_or_dropped(small_policy, small_tokenizer):
    prompt = _prompt(small_tokenizer)
    ref = small_policy.generate_sync(prompt, SamplingParams(max_tokens=12, seed=2))
    eos = ref.token_ids[5]
    first = ref.token_ids.index(eos)
    small_policy.eos_token_ids = frozenset({eos})
    kept = small_policy.generate_sync(prompt, SamplingParams(max_tokens=12, seed=2))
    assert kept.finish_reason == "eos" and kept.token_ids == ref.token_ids[: first + 1]
    assert len(kept.logprobs) == first + 1
    dropped = small_policy.generate_sync(prompt, SamplingParams(max_tokens=12, seed=2, include_eos=False))
    assert dropped.finish_reason == "eos" and dropped.token_ids == ref.token_ids[:first]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.6])
async def test_logprobs_and_entropies_match_sequence_logprobs(small_policy, small_tokenizer, temperature):
    tok = small_tokenizer
    prompts = [_prompt(tok, t) for t in ["the", "quick brown fox jumps over the", "lazy dog 0123"]]
    params = SamplingParams(max_tokens=16, temperature=temperature, seed=9)
    gens = await asyncio.gather(*(small_policy.generate(p, params) for p in prompts))
    # Rescore all three sequences in one left-padded batch.
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    with torch.no_grad():
        lp, ent = sequence_logprobs(small_policy.model, ids, mask, temperature)  # (B, T-1)
    for i, (_p, g) in enumerate(zip(prompts, gens)):
        n = len(g.token_ids)
        torch.testing.assert_close(lp[i, -n:], torch.tensor(g.logprobs), atol=1e-4, rtol=0)
        torch.testing.assert_close(ent[i, -n:], torch.tensor(g.entropies), atol=1e-4, rtol=0)


def test_entropy_is_exact(small_policy, small_tokenizer):
    prompt = _prompt(small_tokenizer)
    g = small_policy.generate_sync(prompt, SamplingParams(max_tokens=6, temperature=0.8, seed=1))
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        logits = small_policy.model(ids).logits[0, len(prompt) - 1 : -1].double() / 0.8  # (n, V)
    p = torch.softmax(logits, -1)
    manual = -(p * p.log()).sum(-1)
    assert manual.min() > 0.5  # a real distribution, not a near one-hot
    assert torch.allclose(manual.float(), torch.tensor(g.entropies), atol=1e-4)
    manual_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(manual_lp.float(), torch.tensor(g.logprobs), atol=1e-4)


def test_greedy_equals_argmax_and_topk1(small_policy, small_tokenizer):
    prompt = _prompt(small_tokenizer)
    greedy = small_policy.generate_sync(prompt, SamplingParams(max_tokens=10, temperature=0.0))
    ids = torch.tensor([prompt + greedy.token_ids])
    with torch.no_grad():
        argmax = small_policy.model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert greedy.token_ids == argmax
    topk1 = small_policy.generate_sync(prompt, SamplingParams(max_tokens=10, top_k=1, seed=4))
    assert topk1.token_ids == greedy.token_ids
    tiny_p = small_policy.generate_sync(prompt, SamplingParams(max_tokens=10, top_p=1e-6, seed=4))
    assert tiny_p.token_ids == greedy.token_ids
    # Truncation is not reflected: reported logprobs are those of softmax(logits / T) at T = 1.
    assert all(lp < 0 for lp in topk1.logprobs)


def test_top_k_limits_choices(small_policy, small_tokenizer):
    prompt = _prompt(small_tokenizer)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        top3 = set(small_policy.model(ids).logits[0, -1].topk(3).indices.tolist())
    firsts = {
        small_policy.generate_sync(prompt, SamplingParams(max_tokens=1, top_k=3, seed=s)).token_ids[0]
        for s in range(40)
    }
    assert firsts <= top3 and len(firsts) >= 2


async def test_same_seed_same_sample_regardless_of_batch_mates(small_policy, small_tokenizer):
    tok = small_tokenizer
    prompt = _prompt(tok)
    params = SamplingParams(max_tokens=24, seed=1234)
    alone = await small_policy.generate(prompt, params)
    mates = [_prompt(tok, t) for t in ["lazy", "jumps over the lazy dog 0123456789", "python"]]
    together = await asyncio.gather(
        small_policy.generate(mates[0], SamplingParams(max_tokens=30, seed=1)),
        small_policy.generate(prompt, params),
        small_policy.generate(mates[1], SamplingParams(max_tokens=5, seed=2)),
        small_policy.generate(mates[2], SamplingParams(max_tokens=40, temperature=1.3, seed=3)),
    )
    assert together[1].token_ids == alone.token_ids
    assert together[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = await small_policy.generate(prompt, SamplingParams(max_tokens=24, seed=1235))
    assert other_seed.token_ids != alone.token_ids


async def test_concurrent_calls_are_batched(small_policy, small_tokenizer):
    tok = small_tokenizer
    prompts = [_prompt(tok, t) for t in ["the", "quick", "brown fox", "lazy dog", "jumps", "over 12"]]
    gens = await asyncio.gather(*(small_policy.generate(p, SamplingParams(max_tokens=10, seed=i)) for i, p in enumerate(prompts)))
    s = small_policy.stats
    assert s.prefill_calls == 1 and s.rows_prefilled == 6 and s.max_rows == 6
    assert s.decode_calls == 9  # 10 tokens: one from the prefill, nine decode steps for all six rows
    assert all(len(g.token_ids) == 10 for g in gens)


async def test_request_joins_a_running_batch(small_policy, small_tokenizer):
    tok = small_tokenizer
    p1, p2 = _prompt(tok, "the quick brown fox jumps"), _prompt(tok, "lazy")
    solo1 = await small_policy.generate(p1, SamplingParams(max_tokens=40, seed=7))
    solo2 = await small_policy.generate(p2, SamplingParams(max_tokens=10, seed=8))
    small_policy.stats.__init__()

    task1 = asyncio.create_task(small_policy.generate(p1, SamplingParams(max_tokens=40, seed=7)))
    while small_policy.stats.decode_calls < 5:
        await asyncio.sleep(0.001)
    g2 = await small_policy.generate(p2, SamplingParams(max_tokens=10, seed=8))
    steps_when_2_done = small_policy.stats.decode_calls
    g1 = await task1
    s = small_policy.stats
    assert s.prefill_calls == 2 and s.max_rows == 2
    assert steps_when_2_done < 39  # request 2 did not wait for request 1 to finish
    assert g1.token_ids == solo1.token_ids and g2.token_ids == solo2.token_ids
    assert g2.logprobs == pytest.approx(solo2.logprobs, abs=1e-5)


async def test_event_loop_stays_free_while_decoding(small_policy, small_tokenizer):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.create_task(ticker())
    await small_policy.generate(_prompt(small_tokenizer), SamplingParams(max_tokens=30, seed=0))
    t.cancel()
    assert ticks > 30


async def test_cancelled_request_leaves_the_batch(small_policy, small_tokenizer):
    tok = small_tokenizer
    long = asyncio.create_task(small_policy.generate(_prompt(tok), SamplingParams(max_tokens=200, seed=0)))
    short = asyncio.create_task(small_policy.generate(_prompt(tok, "lazy"), SamplingParams(max_tokens=60, seed=0)))
    while small_policy.stats.decode_calls < 3:
        await asyncio.sleep(0.001)
    long.cancel()
    g = await short
    assert len(g.token_ids) == 60
    with pytest.raises(asyncio.CancelledError):
        await long
    assert small_policy.stats.generated_tokens < 200


def test_max_batch_size_queues_the_rest(small_tokenizer):
    model = make_small_model(len(small_tokenizer))
    pol = HFPolicy(HFPolicyConfig(model="-", device="cpu", max_batch_size=2), model=model, tokenizer=small_tokenizer)
    prompts = [_prompt(small_tokenizer, t) for t in ["a", "b", "c", "d", "e"]]
    gens = pol.generate_many_sync(prompts, SamplingParams(max_tokens=4, seed=0))
    assert len(gens) == 5 and pol.stats.max_rows == 2 and pol.stats.rows_prefilled == 5


def test_prefill_is_split_by_token_budget(small_tokenizer):
    model = make_small_model(len(small_tokenizer))
    cfg = HFPolicyConfig(model="-", device="cpu", max_prefill_tokens=5, prefix_cache_mb=0)  # whole prefills only
    pol = HFPolicy(cfg, model=model, tokenizer=small_tokenizer)
    texts = ["the quick brown", "lazy", "jumps over the lazy dog", "fox"]
    prompts = [_prompt(small_tokenizer, t) for t in texts]
    gens = pol.generate_many_sync(prompts, SamplingParams(max_tokens=6, seed=3))
    assert pol.stats.prefill_calls >= 3 and pol.stats.max_rows == 4
    for p, g in zip(prompts, gens):
        assert g.token_ids == pol.generate_sync(p, SamplingParams(max_tokens=6, seed=3)).token_ids


async def test_generate_sync_refuses_inside_a_loop(small_policy, small_tokenizer):
    with pytest.raises(RuntimeError, match="await"):
        small_policy.generate_sync(_prompt(small_tokenizer), SamplingParams(max_tokens=2))


def test_prompt_longer_than_context_raises(small_policy):
    with pytest.raises(ValueError, match="context"):
        small_policy.generate_sync([5] * 600, SamplingParams(max_tokens=2))


def test_load_weights_changes_outputs(small_policy, small_tokenizer):
    prompt = _prompt(small_tokenizer)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    before = small_policy.generate_sync(prompt, params)
    v0 = small_policy.weight_version
    assert before.versions == [v0] * len(before.token_ids)
    other = make_small_model(len(small_tokenizer), seed=1)
    small_policy.load_weights((f"module.{k}", v) for k, v in other.state_dict().items())
    after = small_policy.generate_sync(prompt, params)
    assert small_policy.weight_version == v0 + 1 and after.versions == [v0 + 1] * len(after.token_ids)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    ids = torch.tensor([prompt + after.token_ids])
    with torch.no_grad():
        lp, _ = sequence_logprobs(other, ids)
    torch.testing.assert_close(lp[0, len(prompt) - 1 :], torch.tensor(after.logprobs), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="no parameter named"):
        small_policy.load_weights({"not.a.weight": torch.zeros(1)})
    assert small_policy.weight_version == v0 + 1  # a refused push is no new version


def test_a_push_refused_part_way_is_a_new_version_of_the_weights_it_changed(small_tokenizer):
    """A push whose names or shapes are wrong part way has copied the tensors before the bad one: the model's
    weights changed, so its tokens must not keep the old version (a row decoding across the failed push went on
    with the new weights over the old cache, stamped with the old version)."""
    tok = small_tokenizer
    policy = HFPolicy(HFPolicyConfig(model="-", device="cpu"), model=make_small_model(len(tok), seed=0), tokenizer=tok)
    other = make_small_model(len(tok), seed=1).state_dict()
    prompt, params = _prompt(tok), SamplingParams(max_tokens=6, temperature=0.0)
    v0 = policy.weight_version
    with pytest.raises(ValueError, match="no parameter named"):
        policy.load_weights({**other, "not.a.weight": torch.zeros(1)})
    assert policy.weight_version == v0 + 1
    first, *_ = other
    bad = {k: v for k, v in make_small_model(len(tok), seed=0).state_dict().items()}
    bad[first] = torch.zeros(3)  # the first tensor has the wrong shape: nothing copied, no new version
    with pytest.raises(ValueError, match="has shape"):
        policy.load_weights(bad)
    assert policy.weight_version == v0 + 1
    last = list(other)[-1]
    bad = dict(make_small_model(len(tok), seed=0).state_dict())
    bad[last] = torch.zeros(3)  # the last has: every other tensor was copied
    with pytest.raises(ValueError, match="has shape"):
        policy.load_weights(bad)
    assert policy.weight_version == v0 + 2
    assert policy.generate_sync(prompt, params).versions[0] == v0 + 2


def test_a_token_pushed_mid_turn_is_sampled_by_the_weights_its_version_names(small_tokenizer):
    """Pushes of DIFFERENT weights land between decode steps of three turns. Every token, recomputed under the
    weights its version names (the whole context by those weights alone), has the sampler's logprob: the cache the
    old weights computed is recomputed before the next token (before, the tokens after a push came from the new
    weights over the old cache: 0.2 to 1 nat off)."""
    tok = small_tokenizer
    weights = [make_small_model(len(tok), seed=s).state_dict() for s in (0, 1)]
    policy = HFPolicy(HFPolicyConfig(model="-", device="cpu"), model=make_small_model(len(tok), seed=0), tokenizer=tok)
    by_version = {policy.weight_version: weights[0]}
    steps = 0
    step = policy._step

    def pushing(new):  # a push lands between two steps, as from the trainer's thread
        nonlocal steps
        steps += 1
        if steps in (4, 9, 15):
            w = weights[len(by_version) % 2]  # 1, 0, 1: each push changes the weights
            policy.load_weights(w)
            by_version[policy.weight_version] = w
        return step(new)

    policy._step = pushing
    prompts = [_prompt(tok, t) for t in ("the quick brown fox", "lazy", "jumps over the lazy dog 0123")]
    gens = policy.generate_many_sync(prompts, SamplingParams(max_tokens=24, temperature=1.0, seed=7))
    assert len(by_version) == 4 and policy.stats.rows_recomputed > 0
    model = make_small_model(len(tok))
    # fp32 logits of a 2-layer, 64-wide model, batched and padded vs alone: rounding is a few hundred ulps at most.
    tol = 1024 * torch.finfo(torch.float32).eps
    for prompt, g in zip(prompts, gens):
        assert len(set(g.versions)) > 1 and g.versions == sorted(g.versions)  # the pushes landed mid-turn
        for version in sorted(set(g.versions)):
            model.load_state_dict(by_version[version])
            with torch.no_grad():
                lp, _ = sequence_logprobs(model, torch.tensor([prompt + g.token_ids]))
            at = [i for i, v in enumerate(g.versions) if v == version]
            torch.testing.assert_close(
                lp[0, len(prompt) - 1 :][at], torch.tensor(g.logprobs)[at], atol=tol, rtol=0,
                msg=lambda m, v=version: f"tokens stamped version {v}: {m}",
            )  # fmt: skip


def test_a_next_turn_computes_only_its_new_tokens_and_samples_as_a_whole_prefill_does(small_tokenizer):
    """An agent's next turn (the last prompt, its reply, then a tool result) starts from the cache the last
    turn left: only the new tokens are prefilled, and what is sampled and reported is what a policy that
    prefills the whole context samples, each logprob and entropy the model's own scoring of the whole."""
    tok = small_tokenizer
    model = make_small_model(len(tok))
    cached = HFPolicy(HFPolicyConfig(model="-", device="cpu"), model=model, tokenizer=tok)
    whole = HFPolicy(HFPolicyConfig(model="-", device="cpu", prefix_cache_mb=0), model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=4, include_eos=True)
    ctx, reused = _prompt(tok, "the quick brown fox jumps over the lazy dog"), 0
    for turn in range(3):
        a, b = cached.generate_sync(ctx, params), whole.generate_sync(ctx, params)
        assert a.token_ids == b.token_ids and a.versions == b.versions
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(a.entropies), torch.tensor(b.entropies), atol=1e-5, rtol=0)
        with torch.no_grad():
            lp, ent = sequence_logprobs(model, torch.tensor([ctx + a.token_ids]), None, 1.0)
        n = len(a.token_ids)
        torch.testing.assert_close(lp[0, -n:], torch.tensor(a.logprobs), atol=1e-4, rtol=0)
        torch.testing.assert_close(ent[0, -n:], torch.tensor(a.entropies), atol=1e-4, rtol=0)
        reused += len(ctx) + n - 1 if turn < 2 else 0  # what the next turn finds cached: all but the last token
        ctx = ctx + a.token_ids + _prompt(tok, " result 42 .")
    assert (cached.stats.prefix_hits, cached.stats.prefix_tokens) == (2, reused)
    assert (whole.stats.prefix_hits, whole.stats.prefix_tokens) == (0, 0)
    # each turn's cache held the one before it whole: one copy is kept, not three growing ones
    (last,) = cached._kept.caches.values()
    assert cached._kept.nbytes == last.nbytes
    # a branch that leaves the kept context part way (as an ARPO fork does) reuses its start and leaves it as it
    # was: the kept cache is read, never written, and stays for the next branch
    before = [(k.clone(), v.clone()) for k, v in last.kv]
    branch = last.tokens[: len(last.tokens) - 5] + _prompt(tok, " another way")
    a, b = cached.generate_sync(branch, params), whole.generate_sync(branch, params)
    assert a.token_ids == b.token_ids and cached.stats.prefix_tokens == reused + len(last.tokens) - 5
    assert last in cached._kept.caches.values()
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(last.kv, before))


def test_next_turns_arriving_together_prefill_in_one_forward_and_sample_as_whole_prefills_do(small_tokenizer):
    """Three agents' next turns at once, each over its own kept cache (kept contexts and new tokens of different
    lengths): one forward prefills them all, each row feeding the group's most new tokens over the rest of its
    kept context, and each samples and reports what a policy that prefills the whole context does; the kept
    caches are read, not written. Split one hit a forward (`max_prefill_tokens`), the same comes out."""
    tok = small_tokenizer
    model = make_small_model(len(tok))
    cached = HFPolicy(HFPolicyConfig(model="-", device="cpu"), model=model, tokenizer=tok)
    split = HFPolicy(HFPolicyConfig(model="-", device="cpu", max_prefill_tokens=1), model=model, tokenizer=tok)
    whole = HFPolicy(HFPolicyConfig(model="-", device="cpu", prefix_cache_mb=0), model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7, include_eos=True)
    texts = ("the quick brown fox", "a lazy dog sleeps in the warm sun all day long", "one two three four five six")
    ctxs, kept = [_prompt(tok, t) for t in texts], None
    for turn in range(3):
        before = {id(p): (p, [(k.clone(), v.clone()) for k, v in p.kv]) for p in cached._kept.caches.values()}
        calls, hits, reused = cached.stats.prefill_calls, cached.stats.prefix_hits, cached.stats.prefix_tokens
        split_calls = split.stats.prefill_calls
        a, b, c = (pol.generate_many_sync(ctxs, params) for pol in (cached, whole, split))
        if turn:
            new = [len(ctx) - n for ctx, n in zip(ctxs, kept)]
            assert len(set(new)) == 3 and len(set(kept)) == 3
            assert (cached.stats.prefill_calls, cached.stats.prefix_hits) == (calls + 1, hits + 3)
            assert cached.stats.prefix_tokens - reused == sum(len(ctx) - max(new) for ctx in ctxs)
            assert split.stats.prefill_calls == split_calls + 3
        assert all(torch.equal(k, k0) and torch.equal(v, v0)
                   for p, kv in before.values() for (k, v), (k0, v0) in zip(p.kv, kv))  # fmt: skip
        for x, y, z in zip(a, b, c):
            assert x.token_ids == y.token_ids == z.token_ids
            for got in (x, z):
                torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
                torch.testing.assert_close(torch.tensor(got.entropies), torch.tensor(y.entropies), atol=1e-5, rtol=0)
        kept = [len(ctx) + len(x.token_ids) - 1 for ctx, x in zip(ctxs, a)]  # cached: all but the last token
        ctxs = [ctx + x.token_ids + _prompt(tok, " result" + " 7" * i + " .") for i, (ctx, x) in enumerate(zip(ctxs, a))]


def test_the_longest_kept_start_is_found_among_thousands_sharing_a_system_prompt():
    """3,000 kept caches that share a 40-token system prompt: a prompt gets the one holding its longest start,
    or the one added last where only the system prompt is shared; a dropped cache is no longer found; of two
    holders, the one the prompt holds whole; a cache whose index says more than its tokens hold (two runs with
    one hash) is not reused."""
    from agentenv.policies.hf import _chain, _KeptCaches, _Prefix

    def prefix(tokens, nbytes=1):
        return _Prefix(tokens, [], nbytes, _chain(tokens))

    kept, system = _KeptCaches(1 << 30), list(range(40))
    for i in range(3000):
        kept.add(prefix(system + [1000 + i, 7, 8, 9]))
    found, n, key = kept.find(system + [1000 + 1234, 7, 8, 5, 6])
    assert (n, found.tokens[40]) == (43, 1000 + 1234)
    assert next(reversed(kept.caches)) == key  # a hit is the most recently used
    found, n, _ = kept.find(system + [5] * 30)
    assert (n, found.tokens[40]) == (40, 1000 + 2999)  # the system prompt only: the holder added last
    assert kept.find(system + [5] * 50) is None  # 40 of 90 tokens: less than half is worth no reuse
    kept.drop(key)
    found, n, _ = kept.find(system + [1000 + 1234, 7, 8, 5, 6])
    assert n == 40 and found.tokens[40] != 1000 + 1234
    bounded = _KeptCaches(10)
    for i in range(4):
        bounded.add(prefix([i] * 8, nbytes=3))
    assert bounded.nbytes == 9 and bounded.find([0] * 8 + [1]) is None and bounded.find([3] * 8 + [1])[1] == 8
    exact = _KeptCaches(100)  # of two holders of the longest shared run, the one it holds whole (then dropped)
    exact.add(prefix(list(range(1, 11))))
    exact.add(prefix(list(range(1, 13))))
    found, n, _ = exact.find(list(range(1, 11)) + [50] * 5)
    assert n == 10 and len(found.tokens) == 10
    liar = _KeptCaches(100)
    liar.add(_Prefix([1, 2, 3, 4], [], 1, _chain([1, 2, 9, 9])))
    assert liar.find([1, 2, 9, 9, 5]) is None


def test_a_cache_grows_in_place_and_holds_what_concatenation_holds():
    """Decoding appends each token's keys and values into room past the cache (no copy of the whole cache per
    step), moving to a buffer twice as long when the room runs out; the cache always equals the concatenation."""
    from agentenv.policies.hf import _grow

    torch.manual_seed(0)
    with torch.inference_mode():
        ref = torch.randn(2, 3, 5, 4)
        kv = ref.clone()
        moves = 0
        for step in range(80):
            new = torch.randn(2, 3, 1 if step else 7, 4)
            before = kv.untyped_storage().data_ptr()
            kv, ref = _grow(kv, new), torch.cat([ref, new], dim=2)
            moves += kv.untyped_storage().data_ptr() != before
            assert torch.equal(kv, ref)
        assert moves == 2  # into a new buffer twice (5 -> 64, then 64 -> 130 columns), in place 78 times
        kv = _grow(kv, torch.randn(2, 3, 50, 4), limit=150)  # 91 + 50 tokens: the room stops at the limit
        assert kv.shape[2] == 141 and kv.stride(1) == 150 * 4


def test_a_push_drops_the_kept_caches(small_tokenizer):
    """Caches the old weights computed are never reused: after a push the next turn prefills its whole context
    and its tokens carry the new version and the new weights' logprobs."""
    tok = small_tokenizer
    model = make_small_model(len(tok))
    pol = HFPolicy(HFPolicyConfig(model="-", device="cpu"), model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    first = _prompt(tok, "the quick brown fox jumps over")
    g = pol.generate_sync(first, params)
    pol.load_weights({k: v + 0.05 for k, v in model.state_dict().items() if k.endswith("mlp.up_proj.weight")})
    ctx = first + g.token_ids + _prompt(tok, " result .")
    h = pol.generate_sync(ctx, params)
    assert pol.stats.prefix_hits == 0 and h.versions == [1] * len(h.token_ids)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, torch.tensor([ctx + h.token_ids]), None, 1.0)
    torch.testing.assert_close(lp[0, -len(h.token_ids) :], torch.tensor(h.logprobs), atol=1e-4, rtol=0)
    pol.generate_sync(ctx + h.token_ids + _prompt(tok, " again ."), params)  # under the same weights: reused
    assert pol.stats.prefix_hits == 1


def test_kept_caches_stay_within_their_memory_and_the_oldest_go_first(small_tokenizer):
    """40 caches of 200 tokens (100 KiB each in this model) do not fit in 1 MiB: the least recently used go."""
    tok = small_tokenizer
    model = make_small_model(len(tok))
    pol = HFPolicy(HFPolicyConfig(model="-", device="cpu", prefix_cache_mb=1), model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=6)
    words = tok.encode(" ".join(f"w{i}" for i in range(400)))
    prompts = [words[i : i + 200] for i in range(0, 160, 4)]  # 40 distinct prompts, 200 tokens each
    pol.generate_many_sync(prompts, params)
    assert 0 < pol._kept.nbytes <= 1 << 20 and len(pol._kept.caches) < len(prompts)
    hits = pol.stats.prefix_hits
    pol.generate_sync(prompts[-1] + words[300:310], params)  # the newest is kept
    assert pol.stats.prefix_hits == hits + 1
    pol.generate_sync(prompts[0] + words[300:310], params)  # the oldest went first
    assert pol.stats.prefix_hits == hits + 1
