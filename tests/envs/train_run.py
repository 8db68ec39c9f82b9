"""Train a run config with `agentenv train` in a subprocess (as a user would), for the env-class tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from agentenv.training.metrics import read_metrics

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def train(config: dict, tmp_path: Path, steps: int = 2) -> list[dict]:
    """Run `python -m agentenv train` on `config` (its user modules importable from tests/envs); the step records."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    proc = subprocess.run([sys.executable, "-m", "agentenv", "train", str(path)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [r for r in read_metrics(Path(config["trainer"]["output_dir"]) / "metrics.jsonl") if "rollout/reward" in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert r["rollout/failed"] == 0
    return records
