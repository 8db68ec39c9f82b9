"""Both tool-call formats on a real model: SmolLM2-135M-Instruct's tokenizer and chat templates, ARPO's questions,
real search results (the `replay` provider over ARPO's recorded Bing snippets), and turns the model samples.

"Rendered from scratch" is the whole conversation rendered by the chat template in one go (the policy's turns as
assistant messages, the results as tool messages). Hermes: tokenizing that text in one go gives the context token
for token. Tags: the response is one assistant turn holding the results, and SmolLM2's tokenizer merges the policy's
closing `>` with the result's opening `<` into one token `><` when the text is tokenized in one go; the context keeps
the policy's own tokens (never re-tokenized), and every piece the env appended is its text's own tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from agentenv.envs import AgentEnv
from agentenv.envs.chat import check_from_scratch
from agentenv.rollout import Episode
from agentenv.tasks.loaders import load_verl_parquet
from agentenv.types import SamplingParams

pytestmark = pytest.mark.slow

DATA = "/work/shared/data/arpo"
HERMES_SYSTEM = "Answer the question. Search when you need facts. Give the final answer as <answer>\\boxed{...}</answer>."
REPLAYED = "search query: Who directed the film Love Finds Andy Hardy?"  # a query ARPO's recording holds
HERMES = {"tool_format": "hermes", "chat_template": "chatml_hermes", "max_context_tokens": 2048, "max_result_tokens": 200}
TAGS = {"tool_format": "tags", "max_context_tokens": 2048, "max_result_tokens": 200}


@pytest.fixture(scope="module")
def search():
    from agentenv.tools.search import make_search_tool

    return make_search_tool(provider="replay", corpus=f"{DATA}/search_cache.json", k=3, max_chars=200)


@pytest.fixture(scope="module")
def qa_tasks():
    return [t for t in load_verl_parquet(f"{DATA}/valid.parquet") if t.ability == "qa"][:4]


def hermes_task(task):
    return dataclasses.replace(task, messages=({"role": "system", "content": HERMES_SYSTEM}, task.messages[-1]))


def call(query: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': {'query': query}})}\n</tool_call>"


def play(env, tok, task, turns):
    env.reset(seed=0, options={"task": task})
    for text in turns:
        obs, r, term, trunc, info = env.step(tok.encode(text, add_special_tokens=False))
    return info


def test_hermes_episode_equals_the_conversation_rendered_from_scratch(smollm2_tokenizer, search, qa_tasks):
    tok = smollm2_tokenizer
    env = AgentEnv([search], tok, config=HERMES)
    info = play(env, tok, hermes_task(qa_tasks[0]), [
        "I will look it up. " + call(REPLAYED),
        call("Eleanor of Lancaster birth year"),  # not in the recording: BM25 over its snippets
        "<answer>\\boxed{George B. Seitz}</answer>",
    ])  # fmt: skip
    assert info["finish_reason"] == "answer" and info["tool_calls"] == {"search": 2}
    text = env._format.chat.render(env._messages, add_generation_prompt=True)
    assert "Directed by George B. Seitz" in text and '"name": "search"' in text  # a real snippet; the schema
    assert list(tok.encode(text, add_special_tokens=False)) == env.context[: len(env.context) - len(env.trajectory().segments[-1])]
    assert text == tok.decode(env.context[: len(env.context) - len(env.trajectory().segments[-1])])


def test_tags_episode_with_the_models_own_template(smollm2_tokenizer, search, qa_tasks):
    tok = smollm2_tokenizer
    env = AgentEnv([search], tok, config=TAGS)  # SmolLM2's own ChatML template, ARPO's system prompt
    task = qa_tasks[0]
    turns = ["<think> I need the director. </think>\n<search> Love Finds Andy Hardy director </search>",
             "<think> George B. Seitz. </think>\n<answer> The final answer is \\[ \\boxed{George B. Seitz} \\] </answer>"]
    info = play(env, tok, task, turns)
    assert info["finish_reason"] == "answer" and info["tool_calls"] == {"search": 1}
    traj = env.trajectory()
    # From scratch: the template renders the conversation with the response as one assistant turn.
    response = tok.decode(traj.token_ids[traj.prompt_len :], skip_special_tokens=False)
    whole = tok.apply_chat_template([*task.messages, {"role": "assistant", "content": response}], tokenize=False,
                                    continue_final_message=True)  # fmt: skip
    assert whole == tok.decode(traj.token_ids) and "<result>\nPage 1:" in whole
    # Every piece the env appended is its text's own tokens; the policy's pieces are its own.
    pieces = [seg.token_ids if seg.source == "policy" else tok.encode(tok.decode(seg.token_ids), add_special_tokens=False)
              for seg in traj.segments]  # fmt: skip
    assert [t for p in pieces for t in p] == traj.token_ids
    check_from_scratch(env._format.chat, traj.segments, whole)
    # Tokenized in one go, the only difference is the seam `</search>` + `<result>`: `>`, `<` vs `><`.
    one_go = tok.encode(whole, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("><") in one_go and tok.convert_tokens_to_ids("><") not in traj.token_ids


@pytest.fixture(scope="module")
def hf_policy(smollm2_path, smollm2_tokenizer):
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig

    return HFPolicy(HFPolicyConfig(model=smollm2_path, device="cpu"), tokenizer=smollm2_tokenizer)


@pytest.mark.parametrize("fmt", ["hermes", "tags"])
def test_sampled_multi_turn_episodes_stay_exact(fmt, hf_policy, smollm2_tokenizer, search, qa_tasks):
    """The model's own turns (T=1, hf backend), its first turn prefilled with the opening of a search call (this
    model never calls a tool unprompted): the env answers every call and checks the context after each result."""
    tok = smollm2_tokenizer
    config, opener = (HERMES, '<tool_call>\n{"name": "search", "arguments": {"query": "') if fmt == "hermes" else (TAGS, "<search>")
    tasks = [hermes_task(t) if fmt == "hermes" else t for t in qa_tasks[:2]]
    tasks = [dataclasses.replace(t, messages=(*t.messages, {"role": "assistant", "content": opener})) for t in tasks]
    params = SamplingParams(max_tokens=24, temperature=1.0)

    async def run(task, seed):
        # 1,024 tokens of context: at T=1 this model can write malformed calls until the context is full (each is
        # answered and checked, which is the point; 2,048 tokens of them took a minute on 2 cores)
        env = AgentEnv([search], tok, config={**config, "max_tool_calls": 2, "max_context_tokens": 1024})
        ep = Episode(hf_policy, env, params, seed)
        ep.reset(task)
        await ep.run()
        return env

    async def both():
        return await asyncio.gather(*(run(t, 7 * i) for i, t in enumerate(tasks)))

    envs = asyncio.run(both())
    for env in envs:
        traj = env.trajectory()
        assert not traj.failed and traj.info["turns"] >= 2, traj.finish_reason
        assert [s.source for s in traj.segments][:3] == ["prompt", "policy", "tool"]
        assert all(len(s.logprobs) == len(s) for s in traj.segments if s.source == "policy")
        # The env checked after each result; once more on the finished episode, from the messages it kept.
        rendered = env._format.chat.render(env._messages, add_generation_prompt=True) if fmt == "hermes" else None
        env._format.check(env._messages, traj.segments[: _upto_last_tool(traj) + 1])
        if rendered is not None:
            assert rendered == tok.decode(traj.token_ids[: sum(len(s) for s in traj.segments[: _upto_last_tool(traj) + 1])])


def _upto_last_tool(traj) -> int:
    return max(i for i, s in enumerate(traj.segments) if s.source == "tool")
