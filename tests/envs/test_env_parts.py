"""The env as a registered part (`env.class`): a user's game built through the one factory, forked, refused
where it cannot be, and trained by name from YAML with GRPO and ARPO on the tiny model."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from agentenv.configs import config_from_dict
from agentenv.envs.parts import EnvInputs, build_env, env_factory
from agentenv.errors import ConfigError
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode
from agentenv.training.build import make_env_factory
from agentenv.types import Generation, SamplingParams

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # `guess_env` is a user's module, outside the package

from train_run import train  # noqa: E402 - tests/envs on the path first

GUESS_ENV = {
    "class": "guess_env:GuessEnv",
    "options": {"max_guesses": 3},
    "tools": [],
    "tasks": {"source": "guess_env:guess_tasks", "n": 8},
    "max_context_tokens": 256,
    "max_result_tokens": 64,
}


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def guess_config(**env):
    return config_from_dict({"env": {**GUESS_ENV, **env}, "policy": {"backend": "hf", "max_turn_tokens": 16}})


def play(tokenizer, turns, cfg=None, task_index=1):
    cfg = cfg or guess_config()
    task = cfg.env.tasks.load().train[task_index]
    make = make_env_factory(cfg.env, {}, tokenizer)
    policy = ScriptedPolicy(tokenizer, [t.format(secret=task.ground_truth) for t in turns])
    return task, asyncio.run(run_episode(policy, make(), task, SamplingParams(max_tokens=16), seed=0))


def test_the_game_runs_through_the_factory_with_exact_tokens(tiny_tokenizer):
    task, traj = play(tiny_tokenizer, ["1<|im_end|>", "8<|im_end|>", "{secret}<|im_end|>"])
    assert not traj.failed, traj.error
    assert traj.info["turns"] == 3 and traj.reward == pytest.approx(1 - 2 / 3)
    assert traj.correct
    text = tiny_tokenizer.decode(traj.token_ids)
    assert text.count("<|im_start|>user") == 3  # the prompt, "higher", "lower"
    assert "higher" in text and "lower" in text
    # only the policy's own tokens carry the loss
    policy = [t for s in traj.segments if s.source == "policy" for t in s.token_ids]
    assert sum(traj.loss_mask) == len(policy) == 6
    # the context is what the template renders from scratch, token for token
    msgs = [*task.messages, {"role": "assistant", "content": "1"}, {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "8"}, {"role": "user", "content": "lower"},
            {"role": "assistant", "content": task.ground_truth}]  # fmt: skip
    whole = tiny_tokenizer.apply_chat_template(msgs, tokenize=False)
    assert text == whole.rstrip("\n")


def test_a_game_that_runs_out_of_guesses_scores_zero(tiny_tokenizer):
    _, traj = play(tiny_tokenizer, ["1<|im_end|>", "no idea<|im_end|>", "1<|im_end|>"], task_index=2)
    assert traj.reward == 0.0 and not traj.correct and traj.info["turns"] == 3


@pytest.mark.parametrize("bad, kind", [(float("nan"), "nan"), (float("-inf"), "inf"), ("1", "not_a_number")])
def test_a_games_reward_goes_through_the_gate(tiny_tokenizer, monkeypatch, bad, kind):
    """A game's (or an OpenEnv server's) reward enters by the gate every reward passes: no NaN reaches the math."""
    import guess_env

    from agentenv.envs import Reply

    async def respond(self, text):
        return Reply(done=True, reward=bad, correct=True)

    monkeypatch.setattr(guess_env.GuessEnv, "respond", respond)
    _, traj = play(tiny_tokenizer, ["{secret}<|im_end|>"])
    assert traj.failed and traj.reward == 0.0
    assert traj.info["reward"]["error"] == kind


@pytest.mark.parametrize("bad, kind", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_an_env_classs_own_trajectory_reward_goes_through_the_gate(tiny_tokenizer, monkeypatch, bad, kind):
    """An env.class need only satisfy EpisodeEnv: one that builds its own trajectory, not through a TextEnv's
    or an AgentEnv's gate, had its reward reach the advantages unchecked (a NaN skipped the whole update)."""
    import guess_env

    built = guess_env.GuessEnv.trajectory

    def trajectory(self):
        traj = built(self)
        traj.reward = bad
        return traj

    monkeypatch.setattr(guess_env.GuessEnv, "trajectory", trajectory)
    _, traj = play(tiny_tokenizer, ["{secret}<|im_end|>"])
    assert traj.failed and traj.reward == 0.0 and "GuessEnv" in traj.error
    assert traj.info["reward"]["error"] == kind
    assert traj.token_ids  # the episode's tokens are kept (failed: masked, not lost)


def test_fork_copies_the_game_state(tiny_tokenizer):
    cfg = guess_config()
    task = cfg.env.tasks.load().train[1]
    env = make_env_factory(cfg.env, {}, tiny_tokenizer)()
    env.reset(seed=0, options={"task": task})
    ids = tiny_tokenizer.encode("1<|im_end|>", add_special_tokens=False)
    asyncio.run(env.astep(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "eos")))
    child = env.fork()
    win = tiny_tokenizer.encode(task.ground_truth + "<|im_end|>", add_special_tokens=False)
    *_, info = asyncio.run(child.astep(win))
    assert child.done and info["reward"]["correct"]
    assert not env.done and env.secret == child.secret  # the parent plays on, its own state untouched
    assert child.trajectory().parent_uid == env.trajectory().uid
    assert child.trajectory().branch_token == len(env.context)


def test_an_episode_env_with_a_from_options_helper_is_still_an_episode_env(tiny_tokenizer):
    # a client env is one with run, tasks and from_options, as check_env_class says; one helper name is not enough
    cfg = guess_config(**{"class": "guess_env:ConfiguredGuessEnv"})
    assert not cfg.env.env_spec().drives_client
    _, traj = play(tiny_tokenizer, ["{secret}<|im_end|>"], cfg)
    assert traj.correct and not traj.failed, traj.error


def test_the_default_env_class_is_agent_env(tiny_tokenizer):
    cfg = config_from_dict({"env": {"tools": []}})
    spec = cfg.env.env_spec()
    assert spec.name == "agent" and spec.can_fork and spec.cls.__name__ == "AgentEnv"
    env = build_env(spec, EnvInputs(cfg.env, spec.options, (), tiny_tokenizer, cfg.env.reward_fn()))
    assert type(env).__name__ == "AgentEnv"
    assert cfg.to_dict()["env"]["class"] == "agent"  # dumped under the key a config writes
    assert env_factory(spec, cfg.env, (), tiny_tokenizer, cfg.env.reward_fn())() is not env


@pytest.mark.parametrize(
    ("env", "key", "words"),
    [
        ({"class": "guess_env:NotAnEnv"}, "env.class", ["guess_env.NotAnEnv is not an env class", "from_inputs",
                                                         "astep", "fork", "trajectory"]),
        ({"class": "guess_env:nothing_here"}, "env.class", ["failed to import", "nothing_here"]),
        ({"class": "agnet"}, "env.class", ["unknown env class 'agnet'", "Did you mean 'agent'"]),
        ({"options": {"max_guesses": 0}}, "env.options.max_guesses", ["at least 1, got 0"]),
        ({"options": {"max_gueses": 2}}, "env.options.max_gueses", ["did you mean 'max_guesses'"]),
        ({"class": "agent", "options": {"x": 1}}, "env.options", ["takes no options"]),
    ],
)  # fmt: skip
def test_a_bad_env_class_or_option_is_one_error_naming_it(env, key, words):
    with pytest.raises(ConfigError) as e:
        guess_config(**env)
    assert e.value.key == key
    for w in words:
        assert w in str(e.value)


def test_gymnasium_make_of_agent_v0_refuses_another_env_class(tiny_tokenizer):
    import gymnasium

    import agentenv  # noqa: F401 - registers agentenv/Agent-v0

    # it builds an AgentEnv: a `class` naming another env would be ignored, the user's game silently not played
    with pytest.raises(ConfigError) as e:
        gymnasium.make("agentenv/Agent-v0", tokenizer=tiny_tokenizer, config=dict(GUESS_ENV))
    assert e.value.key == "env.class" and "guess_env:GuessEnv" in str(e.value) and "env_factory" in str(e.value)


def test_arpo_refuses_an_env_that_cannot_fork():
    guess_config(**{"class": "guess_env:OneWayGuessEnv"})  # GRPO samples it
    with pytest.raises(ConfigError) as e:
        config_from_dict({"env": {**GUESS_ENV, "class": "guess_env:OneWayGuessEnv"}, "algorithm": {"name": "arpo"},
                          "policy": {"backend": "hf", "max_turn_tokens": 16}})  # fmt: skip
    assert e.value.key == "env.class"
    assert "OneWayGuessEnv" in str(e.value) and "cannot fork" in str(e.value) and "'arpo'" in str(e.value)


def test_arpo_forks_the_game_mid_episode(tiny_tokenizer):
    from agentenv.algorithms.arpo import ARPOConfig, TreeSampler

    cfg = guess_config()
    task = cfg.env.tasks.load().train[1]  # secret 6: "1" gets "higher", a node ARPO may branch at
    policy = ScriptedPolicy(tiny_tokenizer, ["1<|im_end|>", f"{task.ground_truth}<|im_end|>"])
    arpo = ARPOConfig(group_size=4, initial_rollouts=2, alpha=1.0, beta=0.0)  # P_t = 1 > tau: branch where a slot is
    make = make_env_factory(cfg.env, {}, tiny_tokenizer)
    group = asyncio.run(TreeSampler(arpo).sample(policy, make, task, SamplingParams(max_tokens=16), seed=0))
    assert group.info["branch_points"] >= 1 and group.info["fills"] == 0
    trajs = {t.uid: t for t in group.trajectories}
    branches = [t for t in group.trajectories if t.info["arpo"]["role"] == "branch"]
    assert len(branches) == 2 and all(not t.failed for t in group.trajectories)
    prompt = len(tiny_tokenizer.apply_chat_template(list(task.messages), add_generation_prompt=True))
    for b in branches:
        parent = trajs[b.parent_uid]
        assert prompt < b.branch_token < len(parent.token_ids)  # forked mid-episode, after the env's "higher"
        assert b.token_ids[: b.branch_token] == parent.token_ids[: b.branch_token]
        assert "higher" in tiny_tokenizer.decode(b.token_ids[: b.branch_token])
        assert b.correct and b.info["turns"] == 2  # the fork carried the game's state (its turn count, its secret)


RUN = {
    "model": {"path": "tiny"},
    "policy": {"backend": "hf", "temperature": 1.0, "max_turn_tokens": 8},
    "env": GUESS_ENV,
    "trainer": {"steps": 2, "tasks_per_step": 2, "mini_batch_tasks": 2, "micro_batch_size": 8, "lr": 1e-3,
                "eval_tasks": 2, "checkpoint_every": 2},
    "logging": {"tensorboard": False, "progress": False},
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [{"name": "grpo", "group_size": 2},
                                       {"name": "arpo", "group_size": 4, "initial_rollouts": 2, "alpha": 1.0}])  # fmt: skip
def test_the_game_trains_by_name_from_yaml(tmp_path, tiny_model_path, algorithm):
    out = tmp_path / "run"
    config = {**RUN, "algorithm": algorithm, "trainer": {**RUN["trainer"], "output_dir": str(out)}}
    for r in train(config, tmp_path):
        assert 0.0 <= r["rollout/reward"] <= 1.0
        assert r["rollout/trajectories"] == 2 * algorithm["group_size"]
    assert json.loads((out / "config.json").read_text())["env"]["class"] == "guess_env:GuessEnv"
