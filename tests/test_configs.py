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
    assert cfg.env.tools == {"search": {}}
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
        ({}, ["policy.backend=tpu"], r"policy\.backend: unknown policy backend 'tpu'\. Known: hf, vllm"),
        ({}, ["algorithm.name=grpp"], r"algorithm\.name: unknown algorithm 'grpp'\. Did you mean 'grpo'"),
        ({}, ["algorithm.group_size=1"], r"algorithm\.group_size: must be >= 2 .*got 1"),
        ({}, ["algorithm.nonsense=1"], r"algorithm\.nonsense: unknown key"),
        ({}, ["trainer.tasks_per_step=6", "trainer.mini_batch_tasks=4"], r"4 must divide trainer\.tasks_per_step 6"),
        ({}, ["env.tools=[search, shell]"], r"env\.tools: unknown tool 'shell'"),
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


# --------------------------------------------------------------------------- parts by name
HERE_TRAINING = str(__import__("pathlib").Path(__file__).resolve().parent / "training")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.tools=[serch]"], r"env\.tools: unknown tool 'serch'\. Did you mean 'search'\?"),
        (["env.reward=arp"], r"env\.reward: unknown reward 'arp'\. Did you mean 'arpo'\?"),
        (["env.tasks.source=jsnol"], r"env\.tasks\.source: unknown task source 'jsnol'\. Did you mean 'jsonl'\?"),
        (["algorithm.name=arpoo"], r"algorithm\.name: unknown algorithm 'arpoo'\. Did you mean 'arpo'"),
        (["policy.backend=vllmm"], r"policy\.backend: unknown policy backend 'vllmm'\. Did you mean 'vllm'\?"),
        (["model.path=tinny"], r"model\.path: 'tinny' is neither a folder nor a registered model; did you mean 'tiny'\?"),
    ],
)
def test_a_typo_in_a_part_name_suggests_the_closest(overrides, match):
    with pytest.raises(ConfigError, match=match):
        cfg = config_from_dict({}, overrides)
        from agentenv.policies.models import resolve_model_path

        resolve_model_path(cfg.model.path)  # model names resolve when a run starts


def test_a_bad_option_of_a_users_tool_names_its_dotted_key(monkeypatch):
    monkeypatch.syspath_prepend(HERE_TRAINING)
    env = {"tools": {"user_parts:Calculator": {"prefx": "= "}}}
    with pytest.raises(ConfigError, match=r"env\.tools\.user_parts:Calculator\.prefx: unknown key .*did you mean 'prefix'"):
        config_from_dict({"env": env})
    cfg = config_from_dict({"env": {"tools": {"user_parts:Calculator": {"prefix": "= "}}}})
    part, options = cfg.env.tool_parts()["user_parts:Calculator"]
    assert options.prefix == "= " and part.make(options).name == "python"
    with pytest.raises(ConfigError, match=r"env\.tasks: n must be >= 1, got 0"):
        config_from_dict({"env": {"tasks": {"source": "user_parts:products", "n": 0}}})
    with pytest.raises(ConfigError, match=r"env\.tools\.search\.k: must be an int >= 1, got 0"):
        config_from_dict({}, ["env.tools.search.k=0"])


def test_tool_options_and_their_defaults():
    cfg = config_from_dict({"env": {"tools": {"search": {"k": 3}, "python": None}}})
    search, python = (c for _, c in cfg.env.tool_parts().values())
    assert search.k == 3 and search.corpus.endswith("toy/v1-seed0/corpus.jsonl")  # the toy source's corpus
    assert python.mode == "stateless"
    # a list override keeps the options of the tools it keeps
    again = config_from_dict(cfg.to_dict(), ["env.tools=[search]"])
    assert again.env.tools == {"search": {"k": 3}}


@pytest.mark.parametrize(
    "raw, key, where",
    [
        ({"trainer": {"rollout_timeout_s": 60}}, "trainer.rollout_timeout_s", "rollout.episode_timeout_s"),
        ({"env": {"search": {"k": 3}}}, "env.search", "env.tools.search"),
        ({"policy": {"max_batch_size": 8}}, "policy.max_batch_size", "policy.hf.max_batch_size"),
        ({"policy": {"gpu_memory_utilization": 0.2}}, "policy.gpu_memory_utilization", "policy.vllm.gpu_memory_utilization"),
    ],
)
def test_moved_keys_say_where_they_went(raw, key, where):
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert e.value.key == key and where in str(e.value)


def test_policy_backend_sections_are_the_backends_own_config_classes():
    from agentenv.policies.config import HFPolicyConfig
    from agentenv.policies.vllm import VLLMPolicyConfig

    raw = {"policy": {"backend": "vllm", "top_k": 5, "vllm": {"max_model_len": 1024}, "hf": {"max_batch_size": 4}}}
    cfg = config_from_dict(raw, ["trainer.seed=7", "model.dtype=bfloat16"])
    vllm = cfg.backend_config
    assert isinstance(vllm, VLLMPolicyConfig) and vllm.max_model_len == 1024 and vllm.seed == 7
    assert vllm.gpu_memory_utilization is None and vllm.enforce_eager is False  # the backend's own (CPU-aware) defaults
    assert vllm.dtype == "bfloat16" and vllm.model == "tiny"
    hf = config_from_dict(raw, ["policy.backend=hf"]).backend_config  # switching keeps each backend's settings
    assert isinstance(hf, HFPolicyConfig) and hf.max_batch_size == 4
    params = cfg.policy.sampling_params()  # the one place SamplingParams come from
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (256, 1.0, 1.0, 5)
    assert cfg.policy.sampling_params(temperature=0.0).greedy
    with pytest.raises(ConfigError, match=r"policy\.hf\.max_batch_size: must be an int >= 1, got 0"):
        config_from_dict({"policy": {"hf": {"max_batch_size": 0}}})
    with pytest.raises(ConfigError, match=r"policy\.vllm\.model: is set by model\.path"):
        config_from_dict({"policy": {"vllm": {"model": "x"}}})
    with pytest.raises(ConfigError, match=r"policy\.vlm: unknown key .*did you mean 'vllm'"):
        config_from_dict({"policy": {"vlm": {}}})


def test_one_set_of_defaults_and_a_rollout_section():
    from agentenv.envs.config import AgentEnvConfig
    from agentenv.rollout import RolloutConfig

    cfg = config_from_dict({"rollout": {"episode_timeout_s": 45, "max_concurrency": 8}})
    assert cfg.env == AgentEnvConfig() and cfg.rollout == RolloutConfig(episode_timeout_s=45.0, max_concurrency=8)
    with pytest.raises(ConfigError, match=r"rollout\.episode_timeout_s: must be a finite number >= 1, got 0"):
        config_from_dict({}, ["rollout.episode_timeout_s=0"])
