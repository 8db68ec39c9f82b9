"""reasoning-gym as a task source (`env.tasks.source: reasoning_gym`) with its own scoring (`env.reward: reasoning_gym`)."""

from __future__ import annotations

import pytest

from agentenv.configs import config_from_dict
from agentenv.errors import ConfigError
from agentenv.tasks.rewards import get_reward

TASKS = {"source": "reasoning_gym", "datasets": {"basic_arithmetic": {"size": 6, "seed": 3, "max_terms": 3},
                                                 "leg_counting": {"size": 6}}, "eval_size": 4}  # fmt: skip


def env(tasks=TASKS, **extra):
    return {"env": {"tools": {}, "reward": "reasoning_gym", "tasks": tasks, **extra}}


def test_datasets_generate_training_and_held_out_tasks_from_another_seed():
    ts = config_from_dict(env()).env.tasks.load()
    kinds = [t.metadata["kind"] for t in ts.train]
    assert kinds.count("basic_arithmetic") == 6 and kinds.count("leg_counting") == 6
    assert {t.metadata["kind"] for t in ts.heldout} == {"basic_arithmetic", "leg_counting"}
    assert not {t.question for t in ts.train} & {t.question for t in ts.heldout}  # held out: none seen in training
    again = config_from_dict(env()).env.tasks.load()
    assert [t.question for t in again.train] == [t.question for t in ts.train]  # procedural: the seed decides
    assert ts.train[0].messages[0]["role"] == "system" and "<answer>" in ts.train[0].messages[0]["content"]


def test_the_reward_is_the_datasets_own_verifier():
    ts = config_from_dict(env()).env.tasks.load()
    reward = get_reward("reasoning_gym")
    for task in (ts.train[0], ts.train[-1]):
        right = reward(f"Let me think.\n<answer>{task.ground_truth}</answer>", task, {})
        assert right.score == 1.0 and right.correct
        wrong = reward("<answer>-99999</answer>", task, {})
        assert wrong.score == 0.0 and not wrong.correct and wrong.format_ok
        missing = reward(task.ground_truth, task, {})  # no <answer> block: nothing to score
        assert missing.score == 0.0 and not missing.format_ok
    with pytest.raises(ValueError, match="not a reasoning_gym task"):
        from agentenv.envs.testing import make_task

        reward("<answer>42</answer>", make_task(), {})


@pytest.mark.parametrize("tasks, key", [
    ({"source": "reasoning_gym", "datasets": {"basic_arithmetik": {}}}, "env.tasks.datasets.basic_arithmetik"),
    ({"source": "reasoning_gym", "datasets": {"basic_arithmetic": {"max_terms": "many"}}}, "env.tasks.datasets.basic_arithmetic"),
    ({"source": "reasoning_gym", "datasets": {}}, "env.tasks.datasets"),
    ({"source": "reasoning_gym", "datasets": {"leg_counting": {}}, "eval_seed_offset": 0}, "env.tasks.eval_seed_offset"),
])  # fmt: skip
def test_config_errors_name_the_key(tasks, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict(env(tasks))
    assert e.value.key == key, e.value


def test_two_datasets_train_two_steps_and_evaluate_per_dataset(tmp_path, tiny_model_path):
    from agentenv.training.metrics import read_metrics
    from agentenv.training.trainer import Trainer

    cfg = config_from_dict(env(max_context_tokens=512, max_result_tokens=64), [
        "policy.backend=hf", "policy.max_turn_tokens=24", "algorithm.group_size=2", "trainer.steps=2",
        "trainer.tasks_per_step=2", "trainer.mini_batch_tasks=2", "trainer.micro_batch_size=8", "trainer.lr=0.001",
        "trainer.eval_tasks=4", "trainer.checkpoint_every=2", "logging.tensorboard=false", "logging.progress=false",
        f"trainer.output_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    result = Trainer(cfg).train()
    records = read_metrics(result.output_dir / "metrics.jsonl")
    steps = [r for r in records if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)
    report = result.final_eval
    assert report is not None and report.n_tasks == 4 and report.failed == 0
    assert set(report.by_kind) == {"basic_arithmetic", "leg_counting"}  # accuracy per dataset
    final = records[-1]
    assert "eval/accuracy/basic_arithmetic" in final and "eval/accuracy/leg_counting" in final


# ----------------------------------------------------------------------------- issue 37: G3, G11


@pytest.mark.parametrize("dataset, junk", [("game_of_life_halting", "hello"), ("coin_flip", "0"),
                                           ("complex_arithmetic", "nan")])  # fmt: skip
def test_upstream_verifiers_that_pay_for_junk_are_refused_by_name_and_ours_do_not_pay(dataset, junk):
    from agentenv.tasks.reasoning_gym import check_verifier

    ts = config_from_dict(env({"source": "reasoning_gym", "datasets": {dataset: {"size": 2}}, "eval_size": 0})).env.tasks.load()
    with pytest.raises(ConfigError) as e:  # reasoning-gym's own score_answer, as agentenv passed it through before
        check_verifier(dataset, ts.train, upstream=True)
    assert e.value.key == f"env.tasks.datasets.{dataset}" and "scores junk as correct" in str(e.value)
    reward = get_reward("reasoning_gym")
    for task in ts.train:  # loaded: the corrected check pays for the answer, not for junk
        if junk.lower() != task.ground_truth.lower():
            assert reward(f"<answer>{junk}</answer>", task, {}).score < 1.0
        assert reward(f"<answer>{task.ground_truth}</answer>", task, {}).score == 1.0


@pytest.mark.parametrize("tasks, key", [
    ({"datasets": {"leg_counting": {}}, "seed": "abc"}, "env.tasks.seed"),
    ({"datasets": {"leg_counting": {}}, "seed": None}, "env.tasks.seed"),
    ({"datasets": {"leg_counting": {"seed": "abc"}}}, "env.tasks.datasets.leg_counting.seed"),
    ({"datasets": {"leg_counting": {"seed": None}}}, "env.tasks.datasets.leg_counting.seed"),
])  # fmt: skip
def test_a_seed_that_is_no_integer_is_a_config_error_naming_key_and_value(tasks, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict(env({"source": "reasoning_gym", **tasks})).env.tasks.load()
    assert e.value.key == key and repr(tasks.get("seed", tasks["datasets"]["leg_counting"].get("seed"))) in str(e.value)


def test_a_held_out_set_smaller_than_asked_is_one_warning_with_the_numbers(caplog):
    small = {"size": 50, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
    cfg = config_from_dict(env({"source": "reasoning_gym", "datasets": {"basic_arithmetic": small}, "eval_size": 50}))
    with caplog.at_level("WARNING", logger="agentenv.tasks.reasoning_gym"):
        ts = cfg.env.tasks.load()
    kept = len(ts.heldout)
    assert kept < 50
    (line,) = [r.getMessage() for r in caplog.records if "held-out" in r.getMessage()]
    assert f"{kept} held-out tasks of the 50 asked" in line and "basic_arithmetic" in line and "\n" not in line
