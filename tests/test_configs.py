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



def test_a_keyed_field_loads_dumps_and_suggests_under_its_config_key():
    # env.env_class is spelled `class` in a config (a Python keyword cannot name a field)
    cfg = config_from_dict({}, ["env.class=openenv", "env.options.url=http://127.0.0.1:1"])
    assert cfg.env.env_class == "openenv" and cfg.to_dict()["env"]["class"] == "openenv"
    assert "env_class" not in cfg.to_dict()["env"]
    assert config_from_dict(cfg.to_dict()) == cfg
    for typo in ("env.clas=agent", "env.env_class=agent"):
        with pytest.raises(ConfigError, match=r"unknown key \(value 'agent'\); did you mean 'class'\?") as e:
            config_from_dict({}, [typo])
        assert e.value.key == typo.split("=")[0]

# --------------------------------------------------------------------------- parts by name
HERE_TRAINING = str(__import__("pathlib").Path(__file__).resolve().parent / "training")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.tools=[serch]"], r"env\.tools: unknown tool 'serch'\. Did you mean 'search'\?"),
        (["env.reward=arp"], r"env\.reward: unknown reward 'arp'\. Did you mean 'arpo'\?"),
        (["env.tasks.source=jsnol"], r"env\.tasks\.source: unknown task source 'jsnol'\. Did you mean 'jsonl'\?"),
        (["algorithm.name=arpoo"], r"algorithm\.name: unknown algorithm 'arpoo'\. Did you mean 'arpo'"),
        (["env.class=agnet"], r"env\.class: unknown env class 'agnet'\. Did you mean 'agent'\?"),
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

    raw = {"policy": {"backend": "vllm", "top_k": 5, "vllm": {"max_model_len": 1024}, "hf": {"max_batch_size": 4}},
           "env": {"max_context_tokens": 1024}}  # fmt: skip
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


# --------------------------------------------------------------------------- the loader's number check
def _config_classes() -> list[type]:
    """Every config class a run, a tool, a policy backend, an algorithm, the bench or the tiny build loads, nested ones too."""
    import dataclasses
    import typing

    from agentenv.algorithms import _REGISTRY as ALGORITHMS
    from agentenv.bench.config import BenchConfig
    from agentenv.envs.tool_env import ToolEnvConfig
    from agentenv.policies.backends import POLICY_BACKENDS
    from agentenv.tools.registry import TOOLS
    from agentenv.toy.tiny.config import TinyBuildConfig

    roots = [RunConfig, BenchConfig, ToolEnvConfig, TinyBuildConfig]
    roots += [ALGORITHMS.get(n).config_cls for n in ALGORITHMS.names()]
    roots += [r.get(n).config_cls for r in (TOOLS, POLICY_BACKENDS) for n in r.names()]
    seen: list[type] = []
    while roots:
        cls = roots.pop()
        if cls in seen or not dataclasses.is_dataclass(cls):
            continue
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            roots += [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t)]
    return seen


def _number_kinds(hint) -> set:
    import typing

    return {t for t in (hint, *typing.get_args(hint)) if t in (int, float)}


def test_every_number_of_every_config_class_is_checked_by_the_loader():
    import dataclasses
    import typing

    from agentenv.loader import build_dataclass

    checked = 0
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        required = {f.name: "x" for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        for f in fields:
            kinds = _number_kinds(hints[f.name])
            bad = ([float("inf"), float("-inf"), float("nan")] if float in kinds else [])
            bad += ([2**64] + ([-1, 2**32] if f.name == "seed" or f.name.endswith("_seed") else []) if int in kinds else [])
            for value in bad:
                with pytest.raises(ConfigError) as e:
                    build_dataclass(cls, {**required, f.name: value}, "sec")
                assert e.value.key == f"sec.{f.name}" and str(value) in e.value.message, (cls.__name__, f.name, e.value)
                checked += 1
    assert checked > 100  # the classes were found


def test_the_number_check_follows_the_annotation():
    from dataclasses import dataclass

    from agentenv.loader import allow_nonfinite, build_dataclass

    @dataclass
    class Part:
        scale: float = 1.0
        weights: tuple[float, ...] = ()
        limit: float | None = None
        steps: int | float = 1
        count: int = 1
        floor: float = allow_nonfinite(float("-inf"))
        data_seed: int | None = None

    key = r"part\.{}: must be {}"
    for raw, match in [
        ({"weights": [1.0, float("inf")]}, key.format(r"weights\[1\]", "a finite number, got inf")),
        ({"limit": float("nan")}, key.format("limit", "a finite number, got nan")),
        ({"scale": 10**400}, key.format("scale", "a finite number, got a 401-digit integer")),  # not OverflowError
        ({"count": 2**70}, key.format("count", r"an integer in \[-9223372036854775808, 9223372036854775807\]")),
        ({"data_seed": -1}, key.format("data_seed", r"a seed, an integer in \[0, 4294967295\], got -1")),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_dataclass(Part, raw, "part")
    ok = build_dataclass(Part, {"floor": float("-inf"), "steps": 2.5, "limit": "1e3", "data_seed": 2**32 - 1}, "part")
    assert ok.floor == float("-inf") and ok.steps == 2.5 and ok.limit == 1000.0


@pytest.mark.parametrize("value", ["-1", "4294967296", "10000000000000000000000000", "1e25"])
def test_a_seed_numpy_cannot_take_is_refused_at_load(value):
    # numpy raised at set_seed for -1, 2**32 and 1e25, after the model had loaded
    with pytest.raises(ConfigError, match=r"^trainer\.seed: (must be a seed|expected an integer)"):
        config_from_dict({}, [f"trainer.seed={value}"])
    with pytest.raises(ConfigError, match=r"^trainer\.eval_seed: "):
        config_from_dict({}, [f"trainer.eval_seed={value}"])


def test_a_policy_context_shorter_than_the_env_budget_is_refused():
    with pytest.raises(ConfigError, match=r"^policy\.hf\.max_model_len: 16 is below env\.max_context_tokens 2048"):
        config_from_dict({}, ["policy.backend=hf", "policy.hf.max_model_len=16"])
    assert config_from_dict({}, ["policy.backend=hf", "policy.hf.max_model_len=2048"]).backend_config.max_model_len == 2048


def test_a_device_that_does_not_exist_is_refused(monkeypatch):
    import torch

    with pytest.raises(ConfigError, match=r"^policy\.hf\.device: must be auto, cpu, cuda or cuda:N, got 'cuda:abc'"):
        config_from_dict({}, ["policy.backend=hf", "policy.hf.device=cuda:abc"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^policy\.hf\.device: 'cuda' asks for a GPU, but this machine has no CUDA device"):
        config_from_dict({}, ["policy.backend=hf", "policy.hf.device=cuda"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^policy\.hf\.device: 'cuda:2' does not exist: this machine has 2 CUDA"):
        config_from_dict({}, ["policy.backend=hf", "policy.hf.device=cuda:2"])
    assert config_from_dict({}, ["policy.backend=hf", "policy.hf.device=cuda:1"]).backend_config.device == "cuda:1"


def test_trainer_and_sft_share_one_optimizer_config():
    """The nine optimizer and checkpoint fields are one class's; each section keeps its defaults and its key."""
    from dataclasses import fields

    from agentenv.configs import OptimizerConfig

    cfg = config_from_dict({}, ["trainer.lr_schedule=cosine", "sft.warmup_steps=3"])
    shared = {f.name for f in fields(OptimizerConfig)}
    assert len(shared) == 9 and shared <= {f.name for f in fields(cfg.trainer)} and shared <= {f.name for f in fields(cfg.sft)}
    assert (cfg.trainer.lr, cfg.trainer.keep_checkpoints, cfg.trainer.lr_schedule) == (1e-6, 2, "cosine")
    assert (cfg.sft.lr, cfg.sft.keep_checkpoints, cfg.sft.warmup_steps) == (1e-5, 1, 3)
    for key, bad in [("min_lr_ratio", 1.5), ("max_grad_norm", 0), ("keep_checkpoints", 0), ("output_dir", " ")]:
        for section in ("trainer", "sft"):
            with pytest.raises(ConfigError, match=rf"^{section}\.{key}: "):  # named by the section the user wrote
                config_from_dict({section: {key: bad}})


def test_the_algorithm_config_is_built_once(monkeypatch):
    from agentenv.configs import AlgorithmSection

    built = []
    build = AlgorithmSection.build
    monkeypatch.setattr(AlgorithmSection, "build", lambda self: built.append(self.name) or build(self))
    cfg = config_from_dict({"algorithm": {"name": "arpo"}})
    assert cfg.algorithm_config is cfg.algorithm_config and cfg.algorithm_config.group_size == 16
    assert built == ["arpo"]  # at load, validating; never again


@pytest.mark.parametrize(
    "name,key,value",
    [
        ("grpo", "rollout_correction", "is"),
        ("grpo", "rollout_correction_level", "geometric"),
        ("grpo", "off_policy", "async"),
        ("grpo", "loss_agg", "sum"),
        ("arpo", "branch_rule", "always"),
        ("arpo", "advantage", "mixed"),
        ("arpo", "fork_decision", "per_beam"),
        ("arpo", "entropy_norm", "max"),
        ("gigpo", "anchors", "text"),
        ("gigpo", "episode_weighting", "token"),
        ("arpo_gigpo", "anchors", "text"),
    ],
)
def test_an_algorithm_choice_outside_its_literal_is_refused_by_the_loader(name, key, value):
    """The algorithm configs' Literal fields are checked once, by the loader (no hand check behind it)."""
    with pytest.raises(ConfigError, match=rf"must be one of .*, got {value!r}") as e:
        config_from_dict({"algorithm": {"name": name, key: value}})
    assert e.value.key == f"algorithm.{key}"
