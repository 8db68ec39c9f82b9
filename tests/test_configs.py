"""Config loading: typed sections, dotted overrides, errors that name key and value."""

import pytest

from agentenv.configs import RunConfig, config_from_dict, load_config
from agentenv.errors import ConfigError


def test_defaults_validate_and_select_grpo():
    cfg = config_from_dict({})
    assert isinstance(cfg, RunConfig)
    assert cfg.algorithm.name == "grpo" and cfg.algorithm_config.group_size == 8


def test_overrides_are_typed_and_nested():
    cfg = config_from_dict(
        {"trainer": {"lr": 1e-5}},
        ["trainer.lr=0.001", "algorithm.group_size=4", "env.tools=[search]", "policy.backend=vllm"],
    )
    assert cfg.trainer.lr == 0.001
    assert cfg.algorithm_config.group_size == 4
    assert cfg.env.tools == ("search",)
    assert cfg.policy.backend == "vllm"


def test_evaluation_seed_is_the_run_seed_unless_fixed():
    assert config_from_dict({}, ["trainer.seed=3"]).trainer.evaluation_seed == 3
    fixed = config_from_dict({"trainer": {"eval_seed": 0}}, ["trainer.seed=3"]).trainer
    assert fixed.evaluation_seed == 0 and fixed.seed == 3
    with pytest.raises(ConfigError, match="trainer.eval_seed"):
        config_from_dict({}, ["trainer.eval_seed=x"])


def test_exponent_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 (PyYAML) reads `5e-5` as a string; a float field takes it as the number.
    cfg = config_from_dict({"trainer": {"lr": "1E-6"}}, ["trainer.max_grad_norm=5e-1"])
    assert cfg.trainer.lr == 1e-6 and cfg.trainer.max_grad_norm == 0.5
    (tmp_path / "c.yaml").write_text("trainer:\n  lr: 2e-5\n")
    assert load_config(tmp_path / "c.yaml").trainer.lr == 2e-5
    with pytest.raises(ConfigError, match=r"trainer\.lr: expected a number, got '5e-5x'"):
        config_from_dict({}, ["trainer.lr=5e-5x"])


@pytest.mark.parametrize(
    "raw, overrides, match",
    [
        ({}, ["trainer.lr=fast"], r"trainer\.lr: expected a number, got 'fast'"),
        ({}, ["trainer.lrr=1"], r"trainer\.lrr: unknown key .*did you mean 'lr'"),
        ({}, ["policy.backend=tpu"], r"policy\.backend: must be one of 'hf', 'vllm', got 'tpu'"),
        ({}, ["algorithm.name=grpp"], r"algorithm\.name: unknown algorithm 'grpp'\. Did you mean 'grpo'"),
        ({}, ["algorithm.group_size=1"], r"algorithm\.group_size: must be >= 2 .*got 1"),
        ({}, ["algorithm.nonsense=1"], r"algorithm\.nonsense: unknown key"),
        ({}, ["trainer.tasks_per_step=6", "trainer.mini_batch_tasks=4"], r"4 must divide trainer\.tasks_per_step 6"),
        ({}, ["env.tools=[search, shell]"], r"env\.tools: unknown tools \['shell'\]"),
        ({"env": {"tasks": {"source": "jsonl"}}}, [], r"env\.tasks\.path: is required"),
        ({}, ["trainer"], r"dotted\.key=value"),
    ],
)
def test_bad_values_name_key_and_value(raw, overrides, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict(raw, overrides)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_round_trip_through_dict():
    cfg = config_from_dict({}, ["algorithm.group_size=4", "trainer.steps=3"])
    again = config_from_dict(cfg.to_dict())
    assert again == cfg
