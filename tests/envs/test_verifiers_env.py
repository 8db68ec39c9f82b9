"""verifiers environments as the run's env (`env.class: verifiers`): their protocol against agentenv's endpoint,
every token recorded (no prefix break), their rubric as the reward with each function logged; bad ones refused."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.build import build_agent_runner
from agentenv.types import SamplingParams

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_run import train  # noqa: E402 - tests/envs on the path first

CALL = '<tool_call>\n{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}\n</tool_call><|im_end|>'


def vf_env(environment, **options):
    return {"class": "verifiers", "options": {"environment": environment, **options}, "chat_template": "chatml_hermes",
            "max_context_tokens": 1024, "max_result_tokens": 64}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.mark.slow  # verifiers' first import and the endpoint: ~10-20 s on a loaded machine
@pytest.mark.parametrize(("environment", "turns", "parts"), [
    ("vf_envs:arith_env", ["{a}<|im_end|>"], {"correct": 1.0, "brief": 1.0}),
    ("vf_envs:add_tool_env", [CALL, "{a}<|im_end|>"], {"correct": 1.0, "add_calls": 1.0}),
])  # fmt: skip
def test_the_protocol_runs_against_the_endpoint_token_exact(tiny_tokenizer, environment, turns, parts):
    cfg = config_from_dict({"env": vf_env(environment, eval_examples=2), "policy": {"backend": "hf", "max_turn_tokens": 64}})
    client_env = cfg.env.env_spec().client_env()
    tasks = client_env.tasks()
    assert len(tasks.train) == 8 and len(tasks.heldout) == 2
    task = tasks.train[1]
    runner = build_agent_runner(cfg, tiny_tokenizer, client_env)
    policy = ScriptedPolicy(tiny_tokenizer, [t.format(a=task.ground_truth) for t in turns])

    async def go():
        try:
            return await runner.run_episode(policy, task, SamplingParams(max_tokens=64), 0), runner.metrics()
        finally:
            await runner.aclose()

    trajs, metrics = asyncio.run(go())
    assert len(trajs) == 1 and not trajs[0].failed, trajs[0].error
    traj = trajs[0]
    assert metrics["rollout/prefix_breaks"] == 0 and metrics["rollout/endpoint_requests"] == len(turns)
    weights = {"correct": 1.0, "brief": 0.5}
    assert traj.reward == pytest.approx(sum(w * traj.info["reward"]["parts"][k] for k, w in weights.items()
                                            if k in traj.info["reward"]["parts"]))  # fmt: skip
    for k, v in parts.items():
        assert traj.info["reward"]["parts"][k] == v and metrics[f"rollout/reward_part/{k}"] == v
    # every policy token is the scripted turn's, sampled once; the rest is the template's, outside the loss
    written = [tiny_tokenizer.decode(s.token_ids) for s in traj.segments if s.source == "policy"]
    assert written == [t.format(a=task.ground_truth) for t in turns]
    if len(turns) == 2:
        assert "<tool_response>\n3\n</tool_response>" in tiny_tokenizer.decode(traj.token_ids)


@pytest.mark.parametrize(("options", "key", "words"), [
    ({"environment": "vf_envs:broken_env"}, "env.options.environment", ["failed to load", "dataset server is down"]),
    ({"environment": "vf_envs:no_such"}, "env.options.environment", ["failed to import", "no_such"]),
    ({"environment": "vf_envs:add"}, "env.options.environment", ["failed to load"]),
    ({"environment": ""}, "env.options.environment", ["name a verifiers environment"]),
])  # fmt: skip
def test_an_environment_that_fails_to_load_is_one_error_naming_it(options, key, words):
    with pytest.raises(ConfigError) as e:  # at load (a bad option) or when the run builds it (the environment)
        cfg = config_from_dict({"env": {**vf_env(""), "options": options}, "policy": {"backend": "hf"}})
        cfg.env.env_spec().client_env()
    assert e.value.key == key
    for w in words:
        assert w in str(e.value)


@pytest.mark.slow
def test_a_failure_mid_episode_fails_that_episode_only(tiny_tokenizer):
    cfg = config_from_dict({"env": vf_env("vf_envs:flaky_env"), "policy": {"backend": "hf", "max_turn_tokens": 16}})
    client_env = cfg.env.env_spec().client_env()
    task = client_env.tasks().train[0]
    runner = build_agent_runner(cfg, tiny_tokenizer, client_env)

    async def go():
        try:
            return await runner.run_group(ScriptedPolicy(tiny_tokenizer, [task.ground_truth + "<|im_end|>"]), task, 2,
                                          SamplingParams(max_tokens=16), 0)  # fmt: skip
        finally:
            await runner.aclose()

    group = asyncio.run(go())
    failed = [t for t in group if t.failed]
    assert len(failed) == 1 and "the environment's sandbox died" in failed[0].error
    assert [t.reward for t in group if not t.failed] == [1.0]


def test_arpo_refuses_a_verifiers_environment():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"env": vf_env("vf_envs:arith_env"), "algorithm": {"name": "arpo"}, "policy": {"backend": "hf"}})
    assert e.value.key == "env.class" and "'verifiers'" in str(e.value) and "cannot fork" in str(e.value)


def test_ray_placement_refuses_a_verifiers_environment():
    # the Ray runtime builds no endpoint: every episode would fail at make_env instead of the config at load
    with pytest.raises(ConfigError) as e:
        config_from_dict({"env": vf_env("vf_envs:arith_env"), "rollout": {"placement": "ray"}, "policy": {"backend": "hf"}})
    assert e.value.key == "rollout.placement"
    assert "'verifiers'" in str(e.value) and "local" in str(e.value)


def test_sft_refuses_a_verifiers_environment_before_it_starts(tmp_path):
    # SFT replays conversations through an episode env; a client env has none: refused before the output folder,
    # the model's load (a model.path that would not load) or the tools, not by the first replay
    from typer.testing import CliRunner

    from agentenv.cli import app

    cfg = tmp_path / "sft.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"path": str(tmp_path / "no-model")}, "env": vf_env("vf_envs:arith_env"), "policy": {"backend": "hf"},
        "sft": {"solver": "agentenv.toy.solver:solve", "output_dir": str(tmp_path / "sft")},
    }))  # fmt: skip
    res = CliRunner().invoke(app, ["sft", str(cfg)])
    assert res.exit_code != 0
    assert res.output.startswith("error: env.class: 'verifiers'") and len(res.output.splitlines()) == 1, res.output
    assert "agentenv sft" in res.output
    assert not (tmp_path / "sft").exists()


@pytest.mark.slow
@pytest.mark.parametrize("environment", ["vf_envs:arith_env", "vf_envs:add_tool_env"])
def test_a_verifiers_environment_trains_two_steps(tmp_path, tiny_model_path, environment):
    out = tmp_path / "run"
    config = {
        "model": {"path": "tiny"},
        "policy": {"backend": "hf", "temperature": 1.0, "max_turn_tokens": 24},
        "env": vf_env(environment),
        "algorithm": {"name": "grpo", "group_size": 2},
        "trainer": {"steps": 2, "tasks_per_step": 2, "mini_batch_tasks": 2, "micro_batch_size": 8, "lr": 1e-3,
                    "eval_tasks": 2, "checkpoint_every": 2, "output_dir": str(out)},
        "logging": {"tensorboard": False, "progress": False},
    }  # fmt: skip
    for r in train(config, tmp_path):
        assert r["rollout/prefix_breaks"] == 0 and r["rollout/endpoint_requests"] >= 4
        assert "rollout/reward_part/correct" in r
