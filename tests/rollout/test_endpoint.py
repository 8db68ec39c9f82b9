"""The OpenAI-compatible endpoint: the plain `openai` client against a real aiohttp server on 127.0.0.1.

The policy is the scripted one (a real Policy that plays given turns) over the
test tokenizer, so these tests check the protocol and the recording, fast;
tests/rollout/test_endpoint_train.py trains the tiny model through it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx
import openai
import pytest

from agentenv.envs.chat import ChatTemplate, check_from_scratch
from agentenv.errors import ConfigError
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.endpoint.agent import AgentRunner
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.endpoint.server import Endpoint
from agentenv.tasks.rewards import get_reward
from agentenv.types import SamplingParams

HERE = Path(__file__).resolve().parent
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
PARAMS = SamplingParams(max_tokens=400, temperature=1.0)


@pytest.fixture(autouse=True)
def _agents_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture
def chat(tok):
    return ChatTemplate.from_config(tok, "chatml_hermes", {})


def script(tok):
    """Calls `add` first; after a tool result, answers; asked to summarize, summarizes."""

    def turn(prompt: list[int]) -> str:
        text = tok.decode(prompt, skip_special_tokens=False)
        last_user = text.rsplit("<|im_start|>", 2)[-2] if text.count("<|im_start|>") >= 2 else text
        if "Summarize" in last_user:
            return "A sum."
        if "<tool_response>" in last_user:
            return "The sum is 5."
        if "Answer now" in last_user:
            return "5"
        return "Let me add. " + CALL

    return ScriptedPolicy(tok, turn)


async def started(chat, **cfg) -> Endpoint:
    return await Endpoint(chat, EndpointConfig(**cfg), max_context_tokens=4096).start()


def client_of(ep: Endpoint, key: str, base_url: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url or ep.url, api_key=key, max_retries=0)


def rendered_from_scratch(chat: ChatTemplate, messages: list[dict], tools: list | None) -> str:
    import dataclasses

    return dataclasses.replace(chat, tools=tools).render(messages, add_generation_prompt=False)


async def test_a_tool_loop_is_one_trajectory_token_for_token(tok, chat):
    from endpoint_agents import TOOLS

    ep = await started(chat)
    policy = script(tok)
    rec = ep.open_episode(policy, PARAMS, seed=7)
    client = client_of(ep, rec.key)
    try:
        messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2 + 3?"}]
        r1 = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS, logprobs=True)
        msg = r1.choices[0].message
        assert r1.choices[0].finish_reason == "tool_calls"
        assert msg.content == "Let me add."
        (call,) = msg.tool_calls
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
        assert [c.token for c in r1.choices[0].logprobs.content] == [tok.decode([t]) for t in r1.choices[0].token_ids]
        messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        r2 = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
        assert r2.choices[0].message.content == "The sum is 5." and r2.choices[0].finish_reason == "stop"
        assert r2.usage.prompt_tokens > r1.usage.prompt_tokens + r1.usage.completion_tokens
    finally:
        await client.close()
        ep.close_episode(rec.key)
        await ep.aclose()
    (traj,) = rec.trajectories("t0")
    assert [s.source for s in traj.segments] == ["prompt", "policy", "tool", "policy"]
    # the policy's tokens are the ids it sampled, as the endpoint returned them
    assert traj.segments[1].token_ids == r1.choices[0].token_ids
    assert traj.segments[3].token_ids == r2.choices[0].token_ids
    assert traj.segments[1].token_ids[-1] == tok.eos_token_id
    # the whole conversation rendered from scratch, the model's turns as it wrote them
    as_written = [*messages[:2], {"role": "assistant", "content": "Let me add. " + CALL}, messages[3],
                  {"role": "assistant", "content": "The sum is 5."}]  # fmt: skip
    full = rendered_from_scratch(chat, as_written, TOOLS)
    check_from_scratch(dataclasses_replace(chat, TOOLS), traj.segments, full)
    assert tok.decode(traj.token_ids, skip_special_tokens=False) == full.removesuffix("\n")
    assert traj.loss_mask == [0] * len(traj.segments[0]) + [1] * len(traj.segments[1]) + \
        [0] * len(traj.segments[2]) + [1] * len(traj.segments[3])  # fmt: skip
    assert rec.prefix_breaks == 0 and traj.tool_calls == {"add": 1}


def dataclasses_replace(chat, tools):
    import dataclasses

    return dataclasses.replace(chat, tools=tools)


async def test_an_unrelated_sub_call_is_a_second_trajectory_of_the_episode(tok, chat):
    runner = AgentRunner("endpoint_agents:subcall_agent", chat, get_reward("exact"), RolloutConfig(), 4096)
    try:
        group = await runner.run_group(script(tok), _task(), 1, PARAMS, seed=1)
    finally:
        await runner.aclose()
    main, sub = group.trajectories
    assert not main.failed and not sub.failed, (main.error, sub.error)
    assert main.episode == sub.episode is not None and main.uid != sub.uid
    assert sub.parent_uid is None and sub.segments[0].source == "prompt"
    assert "Summarize" in tok.decode(sub.segments[0].token_ids)
    assert main.reward == sub.reward  # they share the episode's reward
    assert runner.metrics()["rollout/prefix_breaks"] == 0


def _task():
    from agentenv.envs.testing import make_task

    return make_task("What is 2 + 3?", "5")


async def test_errors_are_openai_shaped_and_lose_nothing(tok, chat):
    from endpoint_agents import TOOLS

    ep = await started(chat)
    rec = ep.open_episode(script(tok), PARAMS, seed=0)
    client = client_of(ep, rec.key)
    messages = [{"role": "user", "content": "2 + 3?"}]
    try:
        r1 = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
        before = rec.summary()
        ids_before = [t.ids for t in rec.threads]
        # a malformed body, malformed messages, a bad parameter
        async with httpx.AsyncClient() as http:
            bad = await http.post(ep.url + "/chat/completions", content=b"{not json",
                                  headers={"Authorization": f"Bearer {rec.key}"})  # fmt: skip
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="agentenv", messages=[{"role": "robot", "content": "x"}])
        assert e.value.body["code"] == "invalid_messages" and e.value.body["param"] == "messages[0]"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="agentenv", messages=messages, max_tokens=0)
        # an unknown model
        with pytest.raises(openai.NotFoundError) as e:
            await client.chat.completions.create(model="gpt-4o", messages=messages)
        assert e.value.body["code"] == "model_not_found" and "agentenv" in e.value.body["message"]
        # a wrong key
        with pytest.raises(openai.AuthenticationError) as e:
            await client_of(ep, "ae-forged").chat.completions.create(model="agentenv", messages=messages)
        assert e.value.body["code"] == "invalid_api_key"
        assert rec.summary() == before and [t.ids for t in rec.threads] == ids_before  # nothing lost, nothing added
        # the episode goes on: the conversation continues its trajectory
        msg = r1.choices[0].message
        messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"}]
        await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
        assert len(rec.threads) == 1 and rec.threads[0].requests == 2
        # after the episode ended: refused, and its record stays as it was
        ended = ep.close_episode(rec.key)
        kept = ended.summary()
        with pytest.raises(openai.ConflictError) as e:
            await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
        assert e.value.body["code"] == "episode_ended"
        assert ended.summary() == kept
        assert ep.counts["error/invalid_json"] == 1 and ep.counts["error/model_not_found"] == 1
    finally:
        await client.close()
        await ep.aclose()


async def test_one_key_cannot_add_to_read_or_end_another_episode(tok, chat):
    ep = await started(chat)
    a = ep.open_episode(script(tok), PARAMS, seed=1)
    b = ep.open_episode(script(tok), PARAMS, seed=2)
    ca, cb = client_of(ep, a.key), client_of(ep, b.key)
    try:
        mb = [{"role": "user", "content": "2 + 3?"}]
        rb = await cb.chat.completions.create(model="agentenv", messages=mb)
        b_ids = [t.ids for t in b.threads]
        # A sends B's conversation, B's answer included: it is A's own new trajectory, B's stays as it was
        mb2 = mb + [rb.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More?"}]
        ra = await ca.chat.completions.create(model="agentenv", messages=mb2)
        assert ra.model_extra["agentenv"]["episode"] == a.uid
        assert [t.ids for t in b.threads] == b_ids and len(a.threads) == 1 and a.prefix_breaks == 0
        # each key reads its own episode only
        async with httpx.AsyncClient() as http:
            seen_a = (await http.get(ep.url + "/agentenv/episode", headers={"Authorization": f"Bearer {a.key}"})).json()
        assert seen_a["episode"] == a.uid and {t["uid"] for t in seen_a["trajectories"]} == {a.threads[0].uid}
        # A's end is not B's: B goes on
        ep.close_episode(a.key)
        with pytest.raises(openai.ConflictError):
            await ca.chat.completions.create(model="agentenv", messages=mb)
        rb2 = await cb.chat.completions.create(model="agentenv", messages=mb2)
        assert rb2.model_extra["agentenv"]["trajectory"] == b.threads[0].uid and b.threads[0].requests == 2
    finally:
        await ca.close()
        await cb.close()
        await ep.aclose()


def _non_loopback_ip() -> str:
    """An IPv4 address of this machine that is not loopback: its default route's (a UDP connect sends nothing),
    else any interface's."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))
            ip = s.getsockname()[0]
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    import fcntl
    import struct

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        ip = socket.inet_ntoa(packed[20:24])
        if not ip.startswith("127."):
            return ip
    raise AssertionError("this machine has no non-loopback IPv4 address to connect from")


@pytest.mark.parametrize("allow_remote", [False, True])
async def test_only_loopback_clients_unless_configured(tok, chat, allow_remote):
    ep = await started(chat, host="0.0.0.0", allow_remote=allow_remote)
    rec = ep.open_episode(script(tok), PARAMS, seed=0)
    remote = client_of(ep, rec.key, base_url=f"http://{_non_loopback_ip()}:{ep.port}/v1")
    local = client_of(ep, rec.key)
    try:
        assert (await local.models.list()).data[0].id == "agentenv"
        if allow_remote:
            assert (await remote.models.list()).data[0].id == "agentenv"
        else:
            with pytest.raises(openai.PermissionDeniedError) as e:
                await remote.models.list()
            assert e.value.body["code"] == "remote_refused"
    finally:
        await remote.close()
        await local.close()
        await ep.aclose()
    assert EndpointConfig().host == "127.0.0.1"  # the default binds loopback only


async def test_an_edited_history_is_a_prefix_break_and_a_new_trajectory(tok, chat):
    ep = await started(chat)
    rec = ep.open_episode(script(tok), PARAMS, seed=0)
    client = client_of(ep, rec.key)
    try:
        messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2 + 3?"}]
        r1 = await client.chat.completions.create(model="agentenv", messages=messages)
        # the agent rewrites the system prompt before its next turn: the recorded ids no longer lead the rendering
        edited = [{"role": "system", "content": "Add carefully."}, messages[1],
                  r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Answer now."}]  # fmt: skip
        r2 = await client.chat.completions.create(model="agentenv", messages=edited)
    finally:
        await client.close()
        await ep.aclose()
    assert rec.prefix_breaks == 1 and ep.counts["prefix_breaks"] == 1
    first, second = rec.trajectories("t")
    assert second.segments[0].source == "prompt" and second.segments[1].token_ids == r2.choices[0].token_ids
    # the new trajectory renders the edited conversation from scratch, the earlier turn as the policy wrote it
    assert tok.decode(second.segments[0].token_ids, skip_special_tokens=False).startswith("<|im_start|>system\nAdd carefully.")


async def test_concurrent_requests_on_one_prefix_branch_with_exact_ids(tok, chat):
    ep = await started(chat)
    policy = script(tok)
    policy.delay_s = 0.05
    rec = ep.open_episode(policy, PARAMS, seed=0)
    client = client_of(ep, rec.key)
    try:
        messages = [{"role": "user", "content": "2 + 3?"}]
        r1 = await client.chat.completions.create(model="agentenv", messages=messages)
        nxt = messages + [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Answer now."}]
        await asyncio.gather(*(client.chat.completions.create(model="agentenv", messages=nxt) for _ in range(2)))
    finally:
        await client.close()
        await ep.aclose()
    main, branch = rec.trajectories("t")
    assert branch.parent_uid == main.uid and branch.branch_token == len(main.segments[0]) + len(main.segments[1])
    assert branch.segments[0].token_ids[: branch.branch_token] == main.token_ids[: branch.branch_token]
    assert branch.num_policy_tokens == len(main.segments[-1])  # its shared history is not trained twice


async def test_agent_faults_fail_their_episode_only(tok, chat):
    runner = AgentRunner("endpoint_agents:failing_agent", chat, get_reward("exact"), RolloutConfig(), 4096)
    quiet = AgentRunner("endpoint_agents:no_request_agent", chat, get_reward("exact"), RolloutConfig(), 4096)
    try:
        failed = await runner.run_group(script(tok), _task(), 2, PARAMS, seed=0)
        empty = await quiet.run_group(script(tok), _task(), 1, PARAMS, seed=0)
    finally:
        await runner.aclose()
        await quiet.aclose()
    assert len(failed) == 2 and all(t.failed and "the agent's own bug" in t.error for t in failed)
    assert all(t.num_policy_tokens > 0 and sum(t.loss_mask) == 0 for t in failed)  # recorded, masked
    (t,) = empty.trajectories
    assert t.failed and "no chat completion request" in t.error


async def test_an_agent_that_closes_its_client_leaves_the_others_theirs(tok, chat):
    runner = AgentRunner("endpoint_agents:closing_agent", chat, get_reward("exact"), RolloutConfig(), 4096)
    try:
        first = await runner.run_group(script(tok), _task(), 2, PARAMS, seed=0)
        second = await runner.run_group(script(tok), _task(), 2, PARAMS, seed=1)
    finally:
        await runner.aclose()
    assert not any(t.failed for t in [*first, *second]), [t.error for t in [*first, *second]]


def test_config_refuses_tree_samplers_and_bad_agents():
    from agentenv.configs import config_from_dict

    cfg = config_from_dict({}, ["rollout.agent=endpoint_agents:calc_agent", "algorithm.name=rloo"])
    assert cfg.rollout.agent == "endpoint_agents:calc_agent"
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["rollout.agent=endpoint_agents:calc_agent", "algorithm.name=arpo"])
    assert e.value.key == "rollout.agent" and "cannot be forked" in str(e.value)
    with pytest.raises(ConfigError, match="async function"):
        config_from_dict({}, ["rollout.agent=endpoint_agents:not_async"])
    with pytest.raises(ConfigError, match="module:attr"):
        config_from_dict({}, ["rollout.agent=calc_agent"])
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["rollout.endpoint.host=localhost"])
    assert e.value.key == "rollout.endpoint.host"


async def test_a_prefilled_assistant_turn_continues_the_trajectory(tok, chat):
    """An agent that appends a result to the model's own turn and sends it back as the last (assistant) message:
    the turn continues, and only the appended text is new tokens (as the tags format's results)."""
    policy = ScriptedPolicy(tok, ["<python>print(2+3)</python>", "<answer>5</answer>"])
    ep = await started(chat)
    rec = ep.open_episode(policy, PARAMS, seed=0)
    client = client_of(ep, rec.key)
    try:
        messages = [{"role": "user", "content": "2 + 3?"}]
        r1 = await client.chat.completions.create(model="agentenv", messages=messages, stop=["</python>"])
        assert r1.choices[0].message.content == "<python>print(2+3)</python>"
        turn = r1.choices[0].message.content + "<result>\n5\n</result>"
        r2 = await client.chat.completions.create(model="agentenv", messages=messages + [{"role": "assistant", "content": turn}])
    finally:
        await client.close()
        await ep.aclose()
    (traj,) = rec.trajectories("t")
    assert [s.source for s in traj.segments] == ["prompt", "policy", "tool", "policy"]
    assert traj.segments[2].token_ids == tok.encode("<result>\n5\n</result>", add_special_tokens=False)
    assert traj.segments[3].token_ids == r2.choices[0].token_ids and rec.prefix_breaks == 0


@pytest.mark.parametrize("name", ["grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "dr_grpo"])
def test_every_independent_sampler_algorithm_takes_an_agents_groups(name):
    """An agent's group may hold more trajectories than episodes (sub-calls): every independent-sampler
    algorithm gives each of them per-token advantages."""
    from agentenv.algorithms import get_algorithm
    from agentenv.configs import AlgorithmSection
    from agentenv.types import Group, Segment, Trajectory

    cls = get_algorithm(name)
    algo = cls(AlgorithmSection(name=name, params={"group_size": 2}).build())
    assert not getattr(cls, "grows_trees", False)

    def traj(reward: float, n: int, episode: str) -> Trajectory:
        return Trajectory("t", [Segment("prompt", [1, 2]), Segment("policy", [3] * n, [0.0] * n, [0.0] * n)],
                          reward=reward, episode=episode)  # fmt: skip

    group = Group(_task(), [traj(1.0, 3, "e1"), traj(1.0, 2, "e1"), traj(0.0, 4, "e2")])  # e1: main + sub-call
    advs = algo.advantages(group)
    assert [len(a) for a in advs] == [5, 4, 6]
    assert float(advs[0][-1]) > float(advs[2][-1])
    assert float(advs[0][-1]) == float(advs[1][-1])  # an episode's trajectories share its advantage


async def test_a_streaming_client_gets_the_completion_and_it_is_recorded(tok, chat):
    from endpoint_agents import TOOLS

    ep = await started(chat)
    rec = ep.open_episode(script(tok), PARAMS, seed=0)
    client = client_of(ep, rec.key)
    try:
        stream = await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": "2 + 3?"}],
                                                      tools=TOOLS, stream=True, stream_options={"include_usage": True})  # fmt: skip
        chunks = [c async for c in stream]
    finally:
        await client.close()
        await ep.aclose()
    delta = chunks[0].choices[0].delta
    assert delta.content == "Let me add." and delta.tool_calls[0].function.name == "add"
    assert chunks[1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage.completion_tokens > 0
    (traj,) = rec.trajectories("t")
    assert traj.segments[1].token_ids == chunks[0].choices[0].model_extra["token_ids"]
