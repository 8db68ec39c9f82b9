"""The endpoint under attack: one episode must not move another's advantage or hold up its requests, nothing is
recorded that the agent did not get, every failure is an OpenAI-shaped error, counted.

Real HTTP on 127.0.0.1 to the aiohttp endpoint, the plain `openai` client and raw
httpx requests; the policies are real `Policy` objects (scripted turns, some
with engine slots) over the test tokenizer. Scheduling is asserted by
structure (who holds a slot while whom is served), never by wall-clock times.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from typing import Any

import httpx
import openai
import pytest

from agentenv.algorithms import get_algorithm
from agentenv.configs import AlgorithmSection
from agentenv.envs.chat import ChatTemplate
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.endpoint.agent import AgentRunner, agent_http_client
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.endpoint.server import Endpoint
from agentenv.tasks.rewards import get_reward
from agentenv.types import Generation, SamplingParams

PARAMS = SamplingParams(max_tokens=400, temperature=1.0)
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def chat(tok):
    return ChatTemplate.from_config(tok, "chatml_hermes", {})


def _task():
    from agentenv.envs.testing import make_task

    return make_task("What is 2 + 3?", "5")


async def started(chat, max_context_tokens: int = 4096, **cfg) -> Endpoint:
    return await Endpoint(chat, EndpointConfig(**cfg), max_context_tokens=max_context_tokens).start()


def raw_post(ep: Endpoint, key: str, content: bytes, content_type: str = "application/json") -> httpx.Response:
    with httpx.Client() as http:
        return http.post(ep.url + "/chat/completions", content=content,
                         headers={"Authorization": f"Bearer {key}", "Content-Type": content_type})  # fmt: skip


def errors(ep: Endpoint) -> int:
    return sum(v for k, v in ep.counts.items() if k.startswith("error/"))


class Engine:
    """A policy with `slots` decoding slots taken first come, first served (as an engine's batch), that logs each
    generate's episode (the `[name]` its prompt starts with) and holds `hold`'s requests until `release` is set."""

    def __init__(self, tok, slots: int, hold: str | None = None):
        self.tokenizer = tok
        self.weight_version = 0
        self.slots = asyncio.Semaphore(slots)
        self.hold = hold
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.first = asyncio.Event()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        text = self.tokenizer.decode(prompt_ids)
        name = text[text.index("[") + 1 : text.index("]")]
        async with self.slots:
            self.started.append(name)
            self.running[name] = self.running.get(name, 0) + 1
            self.most[name] = max(self.most.get(name, 0), self.running[name])
            self.first.set()
            try:
                if name == self.hold:
                    await self.release.wait()
                await asyncio.sleep(0)
            finally:
                self.running[name] -= 1
        ids = self.tokenizer.encode("ok", add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "eos", None, versions=[0] * len(ids))

    def load_weights(self, named_tensors) -> None:
        pass


def ask(name: str, k: int = 0) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"[{name}] sub-task {k}"}]


# ---------------------------------------------------------------- G1: episodes, not requests
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "dapo"])
async def test_an_episodes_burst_does_not_move_another_episodes_advantage(tok, chat, algorithm):
    """Episode A (reward 1) makes 50 requests (50 trajectories) instead of 1: B's advantage must not move.
    Counting trajectories, B's GRPO advantage went from -0.87 to -5.00."""
    rewards = [1.0, 0.0, 0.0, 1.0]  # A, B, C, D

    def agent_of(burst: int):
        order = itertools.count()

        async def agent(client, task):
            i = next(order)  # episodes start in order
            n = burst if i == 0 else 1
            await asyncio.gather(*(client.chat.completions.create(model="agentenv", messages=ask("ABCD"[i], k))
                                   for k in range(n)))  # fmt: skip
            return rewards[i]

        return agent

    algo = get_algorithm(algorithm)(AlgorithmSection(name=algorithm, params={"group_size": 4}).build())
    advantage_of_b = []
    for burst in (1, 50):
        runner = AgentRunner(agent_of(burst), chat, get_reward("exact"), RolloutConfig(), 4096)
        try:
            group = await runner.run_group(Engine(tok, slots=8), _task(), 4, PARAMS, seed=0)
        finally:
            await runner.aclose()
        assert len(group) == 3 + burst and not any(t.failed for t in group)
        episodes = list(dict.fromkeys(t.episode for t in group))
        assert len(episodes) == 4
        advs = algo.advantages(group)
        by_episode = {}
        for t, a in zip(group.trajectories, advs):
            by_episode.setdefault(t.episode, set()).add(round(float(a[-1]), 9))
        assert all(len(v) == 1 for v in by_episode.values())  # an episode's trajectories share its advantage
        advantage_of_b.append(by_episode[episodes[1]].pop())
    assert advantage_of_b[0] == pytest.approx(advantage_of_b[1], abs=1e-6), advantage_of_b
    if algorithm == "grpo":
        assert advantage_of_b[0] == pytest.approx(-0.5 / (1 / 3) ** 0.5, abs=1e-5)  # (0 - 0.5) / std of [1, 0, 0, 1]


def test_dynamic_sampling_counts_episodes():
    """DAPO keeps a group whose episodes' rewards differ: one episode's two trajectories are not a spread."""
    from agentenv.types import Group, Segment, Trajectory

    def traj(ep: str, reward: float) -> Trajectory:
        return Trajectory("t", [Segment("prompt", [1]), Segment("policy", [2], [0.0], [0.0])], reward=reward, episode=ep)

    algo = get_algorithm("dapo")(AlgorithmSection(name="dapo", params={"group_size": 2}).build())
    one_episode = Group(_task(), [traj("a", 1.0), traj("a", 1.0)])
    assert not algo.keep_group(one_episode)
    assert algo.keep_group(Group(_task(), [traj("a", 1.0), traj("a", 1.0), traj("b", 0.0)]))


async def test_a_burst_holds_at_most_its_share_of_the_policy_and_others_are_served(tok, chat):
    """A's 30 concurrent requests are held inside the policy (never answered until B is served). With 4 engine
    slots, B is served only if A holds at most its share (max_concurrent_per_episode=2) of them."""
    ep = await started(chat, max_concurrent_per_episode=2)
    engine = Engine(tok, slots=4, hold="A")
    a = ep.open_episode(engine, PARAMS, seed=0)
    b = ep.open_episode(engine, PARAMS, seed=1)
    ca = openai.AsyncOpenAI(base_url=ep.url, api_key=a.key, max_retries=0)
    cb = openai.AsyncOpenAI(base_url=ep.url, api_key=b.key, max_retries=0)
    try:
        burst = [asyncio.ensure_future(ca.chat.completions.create(model="agentenv", messages=ask("A", k)))
                 for k in range(30)]  # fmt: skip
        await engine.first.wait()
        served_b = await asyncio.wait_for(cb.chat.completions.create(model="agentenv", messages=ask("B")), 30)
        assert engine.running["A"] == 2 and "B" in engine.started  # B served while A's burst holds its share
        engine.release.set()
        await asyncio.gather(*burst)
    finally:
        engine.release.set()
        await ca.close()
        await cb.close()
        await ep.aclose()
    assert served_b.choices[0].message.content == "ok"
    assert engine.most["A"] == 2 and engine.started.count("A") == 30
    assert len(a.threads) == 30 and a.requests == 30


async def test_requests_past_the_episode_cap_are_refused_counted_and_the_episode_goes_on(tok, chat):
    ep = await started(chat, max_requests_per_episode=3)
    engine = Engine(tok, slots=4)
    a = ep.open_episode(engine, PARAMS, seed=0)
    b = ep.open_episode(engine, PARAMS, seed=1)
    ca = openai.AsyncOpenAI(base_url=ep.url, api_key=a.key, max_retries=0)
    cb = openai.AsyncOpenAI(base_url=ep.url, api_key=b.key, max_retries=0)
    try:
        for k in range(3):
            await ca.chat.completions.create(model="agentenv", messages=ask("A", k))
        with pytest.raises(openai.RateLimitError) as e:
            await ca.chat.completions.create(model="agentenv", messages=ask("A", 3))
        assert e.value.status_code == 429 and e.value.body["code"] == "episode_request_limit"
        assert "rollout.endpoint.max_requests_per_episode" in e.value.body["message"]
        assert ep.counts["error/episode_request_limit"] == 1 and a.requests == 3 and len(a.threads) == 3
        await cb.chat.completions.create(model="agentenv", messages=ask("B"))  # another episode's own count
    finally:
        await ca.close()
        await cb.close()
        await ep.aclose()
    assert b.requests == 1



async def test_a_refusal_no_retry_can_change_is_not_retried_by_the_openai_client(tok, chat):
    """The plain `openai` client retries 409 and 429 twice by default (with backoff): past the cap, or after its
    episode ended, the agent waited for two more refusals and each was counted. `x-should-retry: false` stops it."""
    ep = await started(chat, max_requests_per_episode=1)
    rec = ep.open_episode(ScriptedPolicy(tok, ["x"]), PARAMS, seed=0)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key)  # the client's default retries
    try:
        await client.chat.completions.create(model="agentenv", messages=ask("A"))
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="agentenv", messages=ask("A", 1))
        ep.close_episode(rec.key)
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(model="agentenv", messages=ask("A", 2))
    finally:
        await client.close()
        await ep.aclose()
    assert ep.counts["error/episode_request_limit"] == 1 and ep.counts["error/episode_ended"] == 1


# ---------------------------------------------------------------- G5: nothing recorded unless the reply was produced
@pytest.mark.parametrize("extra,param", [
    ({"stream": True, "stream_options": "yes"}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream": "yes"}, "stream"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream, as OpenAI refuses it
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
], ids=["stream_options-yes", "include_usage-yes", "stream-yes", "logprobs-yes", "options-without-stream",
        "max_completion_tokens-many"])  # fmt: skip
async def test_a_malformed_parameter_is_refused_before_anything_is_generated_or_recorded(tok, chat, extra, param):
    ep = await started(chat)
    policy = ScriptedPolicy(tok, ["hello"])
    rec = ep.open_episode(policy, PARAMS, seed=0)
    try:
        body = {"model": "agentenv", "messages": ask("A")} | extra
        r = await asyncio.to_thread(raw_post, ep, rec.key, json.dumps(body).encode())
    finally:
        await ep.aclose()
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_value" and err["param"] == param
    assert policy.calls == 0 and rec.requests == 0 and rec.threads == [] and errors(ep) == 1


def adder(tok) -> ScriptedPolicy:
    """Calls `add` first; after a tool result, answers."""
    return ScriptedPolicy(tok, lambda prompt: "The answer is 5." if "<tool_response>" in tok.decode(prompt)
                          else "Let me add. " + CALL)  # fmt: skip


async def asked_to_add(client: openai.AsyncOpenAI) -> tuple[list[dict[str, str]], Any, dict[str, Any]]:
    """The first request of an `adder` episode: its messages, the reply (a call of `add`) and its message."""
    messages = [{"role": "user", "content": "2 + 3?"}]
    reply = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
    return messages, reply, reply.choices[0].message.model_dump(exclude_none=True)


async def test_an_edited_turn_that_keeps_its_tool_call_id_is_a_prefix_break(tok, chat):
    """The agent rewrites its own tool call (subtract for add) and keeps the id: the edit is what the next turn
    sees, a new trajectory, counted as a prefix break; the recorded trajectory keeps what the policy wrote."""
    ep = await started(chat)
    rec = ep.open_episode(adder(tok), PARAMS, seed=0)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0)
    try:
        messages, r1, msg = await asked_to_add(client)
        call_id = msg["tool_calls"][0]["id"]
        msg["content"] = "Let me subtract."
        msg["tool_calls"][0]["function"]["arguments"] = '{"a": 2, "b": -3}'
        await client.chat.completions.create(model="agentenv", tools=TOOLS, messages=messages + [
            msg, {"role": "tool", "tool_call_id": call_id, "content": "-1"}])  # fmt: skip
        first_ids = rec.threads[0].ids
        # sent back unedited, the turn is the policy's own again: its trajectory continues
        msg2 = r1.choices[0].message.model_dump(exclude_none=True)
        await client.chat.completions.create(model="agentenv", tools=TOOLS, messages=messages + [
            msg2, {"role": "tool", "tool_call_id": call_id, "content": "5"}])  # fmt: skip
    finally:
        await client.close()
        await ep.aclose()
    assert rec.prefix_breaks == 1 and ep.counts["prefix_breaks"] == 1
    first, edited = rec.trajectories("t")
    assert first.token_ids[: len(first_ids)] == first_ids and first.segments[1].token_ids == r1.choices[0].token_ids
    assert len(first.segments) == 4  # prompt, the call, the tool result, the answer: the unedited resend continued
    prompt = tok.decode(edited.segments[0].token_ids)
    assert "Let me subtract." in prompt and '"b": -3' in prompt and "Let me add." not in prompt


@pytest.mark.parametrize("arguments,edit", [('{"a": 2, "b": 4}', True), ('{"b":3,"a":2}', False)],
                         ids=["arguments-edited", "arguments-reserialized"])  # fmt: skip
async def test_an_edit_of_the_arguments_alone_is_a_prefix_break_and_a_reserialization_is_not(tok, chat, arguments, edit):
    """Only the call's arguments change (content and id kept): an edit, rendered as sent. The same arguments
    written again by a client's JSON encoder (other spacing and key order) are the policy's own turn: it continues."""
    ep = await started(chat)
    rec = ep.open_episode(adder(tok), PARAMS, seed=0)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0)
    try:
        messages, r1, msg = await asked_to_add(client)
        msg["tool_calls"][0]["function"]["arguments"] = arguments
        await client.chat.completions.create(model="agentenv", tools=TOOLS, messages=messages + [
            msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "6"}])  # fmt: skip
    finally:
        await client.close()
        await ep.aclose()
    assert rec.prefix_breaks == int(edit) and len(rec.threads) == 1 + int(edit)
    if edit:
        assert '"b": 4' in tok.decode(rec.threads[1].segments[0].token_ids)


# ---------------------------------------------------------------- G9: every failure OpenAI-shaped, counted
class Raising(ScriptedPolicy):
    async def generate(self, prompt_ids, params):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


BODY = {"model": "agentenv", "messages": [{"role": "user", "content": "hi"}]}


CASES = [
    ("deep JSON", b'{"model": "agentenv", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", None, 400, "invalid_json"),
    ("invalid UTF-8", b'{"model": "agentenv", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None, 400,
     "invalid_encoding"),
    ("unknown charset", json.dumps(BODY).encode(), "application/json; charset=klingon", 415, "unsupported_charset"),
    ("latin-1 charset", json.dumps(BODY).encode(), "application/json; charset=latin-1", 415, "unsupported_charset"),
    ("lone surrogate", b'{"model": "agentenv", "messages": [{"role": "user", "content": "a\\ud800b"}]}', None, 400,
     "invalid_encoding"),
    ("generate raises", json.dumps(BODY).encode(), None, 500, "policy_error"),
]  # fmt: skip


@pytest.mark.parametrize("case,content,content_type,status,code", [pytest.param(*c, id=c[0]) for c in CASES])
async def test_every_failure_is_an_openai_shaped_error_and_counted(tok, chat, case, content, content_type, status, code):
    ep = await started(chat)
    policy = Raising(tok, ["x"]) if case == "generate raises" else ScriptedPolicy(tok, ["x"])
    rec = ep.open_episode(policy, PARAMS, seed=0)
    runner_view = AgentRunner.__new__(AgentRunner)  # the runner's metrics over this endpoint's counts
    runner_view.endpoint, runner_view._seen, runner_view._parts = ep, type(ep.counts)(), {}
    try:
        r = await asyncio.to_thread(raw_post, ep, rec.key, content, content_type or "application/json")
    finally:
        await ep.aclose()
    assert r.status_code == status, (case, r.status_code, r.text[:300])
    assert r.headers["Content-Type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert ep.counts[f"error/{code}"] == 1 and runner_view.metrics()["rollout/endpoint_errors"] == 1
    assert rec.requests == 0 and rec.threads == []
    if case == "generate raises":
        assert "CUDA error" in err["message"]



class NumpyIds(ScriptedPolicy):
    """A policy plugin that hands back numpy integers (its reply cannot be written as JSON)."""

    async def generate(self, prompt_ids, params):
        import numpy as np

        g = await super().generate(prompt_ids, params)
        return Generation(list(np.array(g.token_ids)), g.logprobs, g.entropies, g.finish_reason)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_reply_that_cannot_be_written_is_an_error_before_any_header_and_not_recorded(tok, chat, stream):
    """The reply is serialized whole before its headers go out and before it is recorded. Before, the turn was
    recorded and then the reply failed: a 500 for a recorded turn, or, streaming, a second response written into
    the event stream after its headers (the client read `illegal chunk header`)."""
    ep = await started(chat)
    rec = ep.open_episode(NumpyIds(tok, ["hello"]), PARAMS, seed=0)
    try:
        body = json.dumps(BODY | {"stream": stream}).encode()
        r = await asyncio.to_thread(raw_post, ep, rec.key, body)
    finally:
        await ep.aclose()
    assert r.status_code == 500 and r.headers["Content-Type"].startswith("application/json"), r.text[:300]
    assert r.json()["error"]["code"] == "internal_error" and "int64" in r.json()["error"]["message"]
    assert ep.counts["error/internal_error"] == 1 and ep.counts["requests"] == 0
    assert rec.requests == 0 and rec.threads == []


# ---------------------------------------------------------------- G6: large requests off the loop, bounded first
async def test_a_huge_request_is_rendered_off_the_loop_and_refused_before_tokenizing(tok, chat, monkeypatch):
    """A 300 KB request's rendering is held until a small request of another episode has been answered: on the
    event loop that could never happen. Its rendering is then refused by its size before it is tokenized."""
    small_done, rendering = threading.Event(), threading.Event()
    held: list[bool] = []
    encoded: list[int] = []
    render, encode = ChatTemplate.render, ChatTemplate.encode

    def slow_render(self, messages, **kw):
        if any(len(m.get("content") or "") > 100_000 for m in messages):
            rendering.set()
            held.append(small_done.wait(timeout=20))  # on the loop, the small request cannot finish meanwhile
        return render(self, messages, **kw)

    def counting_encode(self, text):
        encoded.append(len(text))
        return encode(self, text)

    monkeypatch.setattr(ChatTemplate, "render", slow_render)
    monkeypatch.setattr(ChatTemplate, "encode", counting_encode)
    ep = await started(chat, max_context_tokens=1024)
    big = ep.open_episode(ScriptedPolicy(tok, ["x"]), PARAMS, seed=0)
    small = ep.open_episode(ScriptedPolicy(tok, ["y"]), PARAMS, seed=1)
    cbig = openai.AsyncOpenAI(base_url=ep.url, api_key=big.key, max_retries=0)
    csmall = openai.AsyncOpenAI(base_url=ep.url, api_key=small.key, max_retries=0)
    try:
        huge = asyncio.ensure_future(cbig.chat.completions.create(
            model="agentenv", messages=[{"role": "user", "content": "z " * 150_000}]))  # fmt: skip
        while not rendering.is_set():  # the huge request is rendering before the small one is sent
            await asyncio.sleep(0.01)
        r = await csmall.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": "hi"}])
        small_done.set()
        with pytest.raises(openai.BadRequestError) as e:
            await huge
    finally:
        small_done.set()
        await cbig.close()
        await csmall.close()
        await ep.aclose()
    assert r.choices[0].message.content == "y"
    assert held == [True]  # the small request was answered while the huge one was rendering
    assert e.value.body["code"] == "context_length_exceeded" and "characters" in e.value.body["message"]
    assert max(encoded) < 10_000  # the 300,000-character rendering was never tokenized
    assert big.requests == 0 and big.threads == []


async def test_a_large_request_tokenized_off_the_loop_sees_its_trajectory_as_it_matched_it(tok, chat, monkeypatch):
    """X (large: prepared on a worker thread) and Y (small: on the loop) both continue the episode's first trajectory.
    Y is answered and recorded while X's new tokens are being tokenized. X must be placed on the trajectory as X
    matched it (it branches off: its prompt holds no word of Y's turn). Before, X read the trajectory again after
    tokenizing: its prompt got Y's turn, and X's tokens were appended after Y's as if X had continued it."""
    y_done, encoding = threading.Event(), threading.Event()
    encode = ChatTemplate.encode

    def held_encode(self, text):
        if "zq " * 100 in text and threading.current_thread() is not threading.main_thread():
            encoding.set()
            assert y_done.wait(timeout=20)
        return encode(self, text)

    monkeypatch.setattr(ChatTemplate, "encode", held_encode)
    ep = await started(chat, max_context_tokens=200_000)
    rec = ep.open_episode(ScriptedPolicy(tok, lambda prompt: "noted"), PARAMS, seed=0)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0)
    try:
        history = [{"role": "user", "content": "[A] start"}]
        first = await client.chat.completions.create(model="agentenv", messages=history)
        history.append({"role": "assistant", "content": first.choices[0].message.content})
        x = asyncio.ensure_future(client.chat.completions.create(
            model="agentenv", messages=history + [{"role": "user", "content": "zq " * 15_000}]))  # fmt: skip
        while not encoding.is_set():
            await asyncio.sleep(0.01)
        await client.chat.completions.create(model="agentenv", messages=history + [{"role": "user", "content": "ywhy"}])
        y_done.set()
        rx = await x
    finally:
        y_done.set()
        await client.close()
        await ep.aclose()
    by_uid = {t.uid: t for t in rec.threads}
    tx = by_uid[rx.model_extra["agentenv"]["trajectory"]]
    assert "ywhy" not in tx.text and "ywhy" not in tok.decode(tx.ids)  # X's trajectory never saw Y's turn
    assert len(rec.threads) == 2 and tx.parent_uid == rec.threads[0].uid  # X branched off the first trajectory
    assert "zq " * 100 not in rec.threads[0].text


async def test_messages_the_template_refuses_are_the_requests_fault(tok):
    """A template that raises (a model's template refuses roles out of order) answers 400, not a 500."""
    strict = ChatTemplate(tok, "{% for m in messages %}{% if m.role == 'assistant' and loop.first %}"
                               "{{ raise_exception('conversations start with a user turn') }}{% endif %}"
                               "{{ m.content }}{% endfor %}", "strict")  # fmt: skip
    ep = await started(strict)
    rec = ep.open_episode(ScriptedPolicy(tok, ["x"]), PARAMS, seed=0)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="agentenv", messages=[{"role": "assistant", "content": "hi"}])
    finally:
        await client.close()
        await ep.aclose()
    assert e.value.body["code"] == "invalid_messages" and "start with a user turn" in e.value.body["message"]
    assert ep.counts["error/invalid_messages"] == 1 and rec.threads == []


# ---------------------------------------------------------------- a client that leaves: its slot freed, nothing recorded
class HangsFirst(ScriptedPolicy):
    """Its first generate waits until cancelled (and says so); the others answer at once."""

    def __init__(self, tok):
        super().__init__(tok, ["ok"])
        self.cancelled = asyncio.Event()
        self.hung = asyncio.Event()

    async def generate(self, prompt_ids, params):
        if not self.hung.is_set():
            self.hung.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await super().generate(prompt_ids, params)


@pytest.mark.parametrize("via", ["http", "in-process"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_client_that_leaves_frees_its_slot_and_nothing_is_recorded(tok, chat, stream, via):
    """The agent gives up on a request (its client times out and closes the connection): the generation is
    cancelled, its episode's only slot is free for the next request, and the reply nobody read is not recorded.
    Before, the handler ran on: it held the slot until the policy answered, then recorded a turn the agent never
    saw (and, streaming, counted an internal error writing to the closed connection). In-process (the runner's
    clients, `LocalTransport`), the cancelled request cancels its handler alike."""
    ep = await started(chat, max_concurrent_per_episode=1)
    policy = HangsFirst(tok)
    rec = ep.open_episode(policy, PARAMS, seed=0)
    http = {"http_client": agent_http_client(ep)} if via == "in-process" else {}
    impatient = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0, timeout=30, **http)
    client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0, **http)
    try:
        first = asyncio.ensure_future(impatient.chat.completions.create(model="agentenv", messages=ask("A", 0),
                                                                        stream=stream))  # fmt: skip
        await policy.hung.wait()
        first.cancel()  # the agent gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(policy.cancelled.wait(), 10)  # the generation nobody waits for is stopped
        r = await asyncio.wait_for(client.chat.completions.create(model="agentenv", messages=ask("A", 1)), 10)
    finally:
        await impatient.close()
        await client.close()
        if http:
            await http["http_client"].close_pool()
        await ep.aclose()
    assert r.choices[0].message.content == "ok"
    assert rec.requests == 1 and len(rec.threads) == 1 and errors(ep) == 0


def test_the_logged_reward_and_accuracy_count_episodes():
    """Episode A (right, reward 1) made 5 requests, B (wrong, 0) one: the step's reward and accuracy are 0.5, not 5/6.
    A trajectory with no episode (an env-driven one) is an episode of its own."""
    from agentenv.algorithms.core import episode_outcomes
    from agentenv.types import Segment, Trajectory

    def traj(ep: str | None, reward: float) -> Trajectory:
        return Trajectory("t", [Segment("prompt", [1]), Segment("policy", [2], [0.0], [0.0])], reward=reward,
                          episode=ep, info={"reward": {"correct": reward == 1.0}})  # fmt: skip

    rewards, correct = episode_outcomes([traj("a", 1.0)] * 5 + [traj("b", 0.0)])
    assert sum(rewards) / len(rewards) == 0.5 and sum(correct) / len(correct) == 0.5
    rewards, correct = episode_outcomes([traj(None, 1.0), traj(None, 0.0), traj(None, 0.0)])
    assert rewards == [1.0, 0.0, 0.0] and correct == [1.0, 0.0, 0.0]


def test_evaluation_counts_episodes():
    """An evaluated group of two episodes, A right with 3 trajectories (sub-calls), B wrong with 1: accuracy and
    pass@1 are 1/2 and pass@2 is 1 (two samples, one right), not 3/4 over four 'samples'."""
    from agentenv.training.evaluate import summarize
    from agentenv.types import Group, Segment, Trajectory

    def traj(ep: str, right: bool) -> Trajectory:
        return Trajectory("t", [Segment("prompt", [1]), Segment("policy", [2], [0.0], [0.0])], reward=float(right),
                          episode=ep, info={"reward": {"correct": right}})  # fmt: skip

    report = summarize([Group(_task(), [traj("a", True)] * 3 + [traj("b", False)])])
    assert report.accuracy == 0.5 and report.reward == 0.5 and report.n_samples == 2
    assert report.pass_at == {1: 0.5, 2: 1.0}
