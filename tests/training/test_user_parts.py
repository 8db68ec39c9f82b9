"""A user's tool, reward and task source, named in YAML, trained with `agentenv train` (a subprocess, the tiny model).

Once by `module:attr` (`tests/training/user_parts.py`), once through the entry
points of a throwaway package installed into a temporary folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentenv.training.metrics import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

BUDGET = {
    "model": {"path": "tiny"},
    "policy": {"backend": "hf", "temperature": 0.7, "max_turn_tokens": 48},
    "algorithm": {"name": "grpo", "group_size": 2},
    "trainer": {
        "steps": 2, "tasks_per_step": 2, "mini_batch_tasks": 2, "micro_batch_size": 4, "lr": 1e-3,
        "eval_tasks": 2, "checkpoint_every": 2,
    },
    "logging": {"tensorboard": False, "progress": False},
}  # fmt: skip


def train(config: dict, tmp_path: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [ROOT, *pythonpath])))
    return subprocess.run(
        [sys.executable, "-m", "agentenv", "train", str(path)], capture_output=True, text=True, timeout=600,
        env=env, cwd=tmp_path,
    )  # fmt: skip


def check_run(proc: subprocess.CompletedProcess, out: Path, log: Path) -> list[dict]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["output_dir"] == str(out)
    records = [r for r in read_metrics(out / "metrics.jsonl") if "rollout/reward" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/failed"] == 0
        assert 0.0 <= r["rollout/reward"] <= 1.0  # the user's reward: never ARPO's -1
    calls = log.read_text().splitlines()
    assert calls, "the user's tool was never called"  # its log holds whatever the model sent, one call a line
    assert json.loads((out / "config.json").read_text())["env"]["tools"]
    return records


def test_module_attr_parts_train_two_steps(tmp_path, tiny_model_path):
    log, out = tmp_path / "calls.txt", tmp_path / "run"
    config = {
        **BUDGET,
        "env": {
            "tools": {"user_parts:Calculator": {"log": str(log), "prefix": "= "}},
            "tasks": {"source": "user_parts:products", "n": 8, "seed": 1},
            "reward": "user_parts:boxed_equal",
            "max_tool_calls": 2,
            "max_context_tokens": 512,
            "max_result_tokens": 64,
        },
        "trainer": {**BUDGET["trainer"], "output_dir": str(out)},
    }
    records = check_run(train(config, tmp_path, [HERE]), out, log)
    assert sum(r["rollout/tool_calls_per_traj"] for r in records) > 0


ENTRY_POINTS = """\
[agentenv.tools]
calculator = user_parts:Calculator

[agentenv.task_sources]
products = user_parts:products

[agentenv.rewards]
boxed_equal = user_parts:boxed_equal
broken = no_such_module_here:reward

[agentenv.algorithms]
grpo_plugin = ep_plugin:PluginGRPO
"""


def install_plugin(site: Path) -> None:
    """A throwaway distribution `ep-plugin`: a module and a dist-info whose entry points name the user's parts."""
    (site / "ep_plugin.py").write_text(
        "from agentenv.algorithms.grpo import GRPO\n\n\nclass PluginGRPO(GRPO):\n    \"\"\"GRPO, shipped by a plugin.\"\"\"\n"
    )
    dist = site / "ep_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)


def test_entry_point_plugins_train_by_plain_names(tmp_path, tiny_model_path):
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    log, out = tmp_path / "calls.txt", tmp_path / "run"
    config = {
        **BUDGET,
        "env": {
            "tools": {"calculator": {"log": str(log)}},
            "tasks": {"source": "products", "n": 8},
            "reward": "boxed_equal",
            "max_tool_calls": 2,
            "max_context_tokens": 512,
            "max_result_tokens": 64,
        },
        "algorithm": {"name": "grpo_plugin", "group_size": 2},
        "trainer": {**BUDGET["trainer"], "output_dir": str(out)},
    }
    check_run(train(config, tmp_path, [site, HERE]), out, log)

    # A plugin that fails to import is named, with the cause; nothing starts.
    bad = train({**config, "env": {**config["env"], "reward": "broken"}}, tmp_path, [site, HERE])
    assert bad.returncode == 2
    assert "env.reward: reward plugin 'broken' from ep-plugin: 'no_such_module_here:reward' failed to import" in bad.stderr
    assert "ModuleNotFoundError" in bad.stderr
