"""OpenEnv servers as the env (`env.class: openenv`): a server written with openenv-core's own API in a process on
127.0.0.1, one session per episode (closed at the end, on failure and on cancellation), and broken servers (down,
hanging, malformed) that fail only their own episode with an error naming the server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import WSMsgType, web

from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode, run_group
from agentenv.rollout.config import RolloutConfig
from agentenv.tasks import Task
from agentenv.training.build import make_env_factory
from agentenv.types import SamplingParams

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_run import train  # noqa: E402 - tests/envs on the path first

TASK = Task("word", ({"role": "system", "content": "Play the word game."},), "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The word-game server (tests/envs/openenv_server.py) in its own process; yields (url, session log)."""
    tmp = tmp_path_factory.mktemp("openenv")
    port, log = free_port(), tmp / "sessions.txt"
    log.touch()
    with (tmp / "server.err").open("w") as err:
        proc = subprocess.Popen([sys.executable, str(HERE / "openenv_server.py"), str(port), str(log)], stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"the OpenEnv server did not start: {(tmp / 'server.err').read_text()[-2000:]}")
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def openenv(url, **options):
    return {"class": "openenv", "options": {"url": url, "observation_field": "prompt", **options}, "tools": [],
            "max_context_tokens": 512, "max_result_tokens": 64}  # fmt: skip


def make_env(url, tokenizer, **options):
    cfg = config_from_dict({"env": openenv(url, **options), "policy": {"backend": "hf", "max_turn_tokens": 16}})
    return make_env_factory(cfg.env, {}, tokenizer)


def sessions(log: Path) -> tuple[int, int]:
    """(opened, closed) sessions, once the server has had a moment to close the last ones."""
    for _ in range(50):
        words = log.read_text().split()
        if words.count("open") == words.count("close"):
            break
        time.sleep(0.1)
    return words.count("open"), words.count("close")


@pytest.mark.slow  # the server process starts in 10-40 s on a loaded machine
def test_episodes_are_server_sessions_rendered_into_tokens(server, tiny_tokenizer):
    url, log = server
    policy = ScriptedPolicy(tiny_tokenizer, ["yes<|im_end|>", "no<|im_end|>"])
    traj = asyncio.run(run_episode(policy, make_env(url, tiny_tokenizer)(), TASK, SamplingParams(max_tokens=16), 0))
    assert not traj.failed, traj.error
    assert traj.reward == 1.0 and traj.correct and traj.info["turns"] == 2  # the server's rewards and done
    text = tiny_tokenizer.decode(traj.token_ids)
    assert "<|im_start|>user\nSay a word.<|im_end|>" in text  # the reset observation, as a user turn
    assert "You said 'yes'. Another word." in text  # the policy's text became the action's message
    assert sum(traj.loss_mask) == sum(len(s.token_ids) for s in traj.segments if s.source == "policy")
    # a group of episodes: one session each, every one closed
    before = sessions(log)
    group = asyncio.run(run_group(policy, make_env(url, tiny_tokenizer), TASK, 3, SamplingParams(max_tokens=16), 0))
    assert not any(t.failed for t in group)
    opened, closed = sessions(log)
    assert opened - before[0] == 3 and closed == opened


class Hang:
    """A policy that never answers: the episode is cancelled while its session is open."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(3600)

    def load_weights(self, named_tensors):
        pass


@pytest.mark.slow
def test_a_cancelled_or_timed_out_episode_closes_its_session(server, tiny_tokenizer):
    url, log = server
    before = sessions(log)

    async def cancelled():
        task = asyncio.ensure_future(run_episode(Hang(tiny_tokenizer), make_env(url, tiny_tokenizer)(), TASK,
                                                 SamplingParams(max_tokens=16), 0))  # fmt: skip
        await asyncio.sleep(1.0)  # reset done, the policy waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    traj = asyncio.run(run_episode(Hang(tiny_tokenizer), make_env(url, tiny_tokenizer)(), TASK,
                                   SamplingParams(max_tokens=16), 0, RolloutConfig(episode_timeout_s=2.0)))  # fmt: skip
    assert traj.failed and "timed out" in traj.error
    opened, closed = sessions(log)
    assert opened - before[0] == 2 and closed == opened


async def fake_server(mode: str):
    """A raw OpenEnv-protocol WebSocket server that misbehaves: `hang` never answers the first session's step,
    `malformed` answers reset with a string for an observation."""
    seen = []

    async def ws(request):
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        seen.append(sock)
        first = len(seen) == 1
        async for msg in sock:
            if msg.type != WSMsgType.TEXT:
                break
            kind = json.loads(msg.data)["type"]
            if kind == "close":
                break
            if kind == "reset":
                obs = "not an observation" if mode == "malformed" else {"prompt": "Say a word."}
                await sock.send_str(json.dumps({"type": "observation", "data": {"observation": obs, "done": False}}))
            elif kind == "step" and not (mode == "hang" and first):
                data = {"observation": {"prompt": "ok"}, "reward": 0.5, "done": True}
                await sock.send_str(json.dumps({"type": "observation", "data": data}))
        return sock

    app = web.Application()
    app.router.add_get("/ws", ws)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(("mode", "words", "others_ok"), [
    ("down", ["http://127.0.0.1:", "(env.options.url) is not reachable"], False),
    ("hang", ["did not answer a step within 0.5 s", "env.options.message_timeout_s"], True),
    ("malformed", ["answered reset with a malformed observation", "not an observation"], False),
])  # fmt: skip
def test_a_broken_server_fails_its_episode_only_naming_the_server(tiny_tokenizer, mode, words, others_ok):
    async def go():
        runner, url = await fake_server(mode)
        if mode == "down":
            await runner.cleanup()  # the port is closed: nothing listens
        try:
            policy = ScriptedPolicy(tiny_tokenizer, ["yes<|im_end|>"])
            make = make_env(url, tiny_tokenizer, message_timeout_s=0.5, connect_timeout_s=2.0)
            return await run_group(policy, make, TASK, 2, SamplingParams(max_tokens=16), 0)
        finally:
            if mode != "down":
                await runner.cleanup()

    group = asyncio.run(go())
    failed = [t for t in group if t.failed]
    assert failed, "a broken server must fail its episode"
    for t in failed:
        for w in words:
            assert w in t.error
        assert t.error.startswith("InfraError: the OpenEnv server at http://127.0.0.1:")
    if others_ok:  # the hang is the first session's only: the other episode ends with the server's reward
        assert len(failed) == 1 and [t.reward for t in group if not t.failed] == [0.5]


def test_bad_openenv_options_and_arpo_are_refused():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"env": openenv("127.0.0.1:8000"), "policy": {"backend": "hf"}})
    assert e.value.key == "env.options.url" and "base URL" in str(e.value)
    with pytest.raises(ConfigError) as e:
        config_from_dict({"env": openenv("http://127.0.0.1:1"), "algorithm": {"name": "arpo"}, "policy": {"backend": "hf"}})
    assert e.value.key == "env.class" and "OpenEnvEnv" in str(e.value) and "cannot fork" in str(e.value)


@pytest.mark.slow
def test_an_openenv_server_trains_two_steps(server, tmp_path, tiny_model_path):
    url, log = server
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"w{i}", "messages": [{"role": "system", "content": "Play."}],
                                         "answer": ""}) + "\n" for i in range(4)))  # fmt: skip
    out = tmp_path / "run"
    config = {
        "model": {"path": "tiny"},
        "policy": {"backend": "hf", "temperature": 1.0, "max_turn_tokens": 8},
        "env": {**openenv(url), "tasks": {"source": "jsonl", "path": str(tasks), "eval_path": str(tasks)}},
        "algorithm": {"name": "grpo", "group_size": 2},
        "trainer": {"steps": 2, "tasks_per_step": 2, "mini_batch_tasks": 2, "micro_batch_size": 8, "lr": 1e-3,
                    "eval_tasks": 2, "checkpoint_every": 2, "output_dir": str(out)},
        "logging": {"tensorboard": False, "progress": False},
    }  # fmt: skip
    before = sessions(log)
    for r in train(config, tmp_path):
        assert r["rollout/trajectories"] == 4
    opened, closed = sessions(log)
    assert opened - before[0] >= 8 and closed == opened  # every episode's session (training and evaluation) closed


@pytest.mark.slow
def test_a_killed_run_leaves_no_session_open(server, tmp_path, tiny_model_path):
    """SIGKILL the trainer while its episodes hold sessions: the server ends every one (the connections drop)."""
    import signal

    import yaml

    url, log = server
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "w", "messages": [{"role": "system", "content": "Play."}], "answer": ""}) + "\n")
    config = {
        "model": {"path": "tiny"}, "policy": {"backend": "hf", "max_turn_tokens": 8},
        "env": {**openenv(url), "tasks": {"source": "jsonl", "path": str(tasks)}},
        "algorithm": {"name": "grpo", "group_size": 4},
        "trainer": {"steps": 100, "tasks_per_step": 1, "mini_batch_tasks": 1, "micro_batch_size": 4,
                    "eval_every": 0, "eval_tasks": 0, "output_dir": str(tmp_path / "run")},
        "logging": {"tensorboard": False, "progress": False},
    }  # fmt: skip
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    before = sessions(log)[0]
    proc = subprocess.Popen([sys.executable, "-m", "agentenv", "train", str(tmp_path / "run.yaml")], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(HERE.parents[1])), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    held = 0  # sessions open when the kill is sent (the run trains between rollouts, with none open)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it was killed"
            words = log.read_text().split()
            if words.count("open") >= before + 6 and words.count("open") > words.count("close"):
                held = words.count("open") - words.count("close")
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert held >= 1, "no session was open in a rollout within 300 s"
    opened, closed = sessions(log)
    assert closed == opened
