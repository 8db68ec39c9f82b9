"""ARPO's run configs load and validate, and differ from their GRPO twins only in `algorithm`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from agentenv.algorithms.arpo import ARPOConfig
from agentenv.configs import load_config
from agentenv.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _without_algorithm(path: Path) -> dict:
    raw = yaml.safe_load(path.read_text())
    raw.pop("algorithm")
    raw.get("trainer", {}).pop("output_dir", None)
    return raw


def test_paper_config_has_the_papers_settings():
    cfg = load_config(CONFIGS / "paper_arpo_qwen2.5-7b.yaml")
    a = cfg.algorithm_config
    assert isinstance(a, ARPOConfig)
    # Z = 1: the published run's beam_size 2 counts the path that continues
    assert (a.group_size, a.initial_rollouts, a.forks_per_branch, a.alpha, a.beta, a.tau, a.entropy_window) == (
        16, 8, 1, 0.5, 0.2, 0.5, 20,
    )  # fmt: skip
    assert a.kl_coef == 0.0 and a.advantage == "soft"
    assert cfg.env.max_tool_calls == 5
    assert (cfg.trainer.tasks_per_step, cfg.trainer.mini_batch_tasks, cfg.trainer.lr) == (128, 16, 1e-6)
    assert (cfg.policy.max_turn_tokens, cfg.policy.temperature) == (4096, 1.0)


@pytest.mark.parametrize(
    "arpo, grpo", [("paper_arpo_qwen2.5-7b.yaml", "paper_grpo_qwen2.5-7b.yaml"), ("toy_arpo.yaml", "toy_grpo.yaml")]
)
def test_arpo_and_grpo_configs_compare_like_with_like(arpo, grpo):
    assert _without_algorithm(CONFIGS / arpo) == _without_algorithm(CONFIGS / grpo)
    a, g = load_config(CONFIGS / arpo), load_config(CONFIGS / grpo)
    assert a.algorithm_config.group_size == g.algorithm_config.group_size  # M = G: the same budget


def test_toy_config_loads():
    cfg = load_config(CONFIGS / "toy_arpo.yaml")
    a = cfg.algorithm_config
    assert isinstance(a, ARPOConfig) and a.group_size == 8 and a.initial_rollouts == 4
    assert cfg.model.path == "tiny"


def test_overrides_reach_the_arpo_section():
    cfg = load_config(CONFIGS / "paper_arpo_qwen2.5-7b.yaml", ["algorithm.forks_per_branch=3", "algorithm.advantage=hard"])
    assert cfg.algorithm_config.forks_per_branch == 3 and cfg.algorithm_config.advantage == "hard"
    with pytest.raises(ConfigError, match="N 17 must be <= group_size M 16"):
        load_config(CONFIGS / "paper_arpo_qwen2.5-7b.yaml", ["algorithm.initial_rollouts=17"])
    assert load_config(CONFIGS / "paper_arpo_qwen2.5-7b.yaml", ["algorithm.initial_rollouts=16"]).algorithm_config.branch_budget == 0
    assert dataclasses.is_dataclass(cfg.algorithm_config)
