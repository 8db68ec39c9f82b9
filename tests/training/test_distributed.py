"""Two CPU processes (torchrun, gloo): ranks end with identical weights that differ from the start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from agentenv.configs import config_from_dict

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_two_cpu_processes_agree(fast_overrides, launch_cmd, tmp_path):
    # Groups of 4: a group of 2 two-hop episodes often scores the same twice (no gradient), and the
    # weights must move.
    cfg = config_from_dict({}, fast_overrides + ["trainer.steps=2", "trainer.eval_tasks=1", "algorithm.group_size=4"])
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    cmd = launch_cmd(HERE / "ddp_run.py", str(cfg_file), str(tmp_path), nproc=2)
    proc = subprocess.run(cmd, cwd=HERE.parents[1], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert r0["world"] == r1["world"] == 2
    assert torch.equal(r0["before"], r1["before"])
    assert torch.equal(r0["after"], r1["after"]), "ranks diverged"
    assert not torch.equal(r0["before"], r0["after"]), "weights did not change"
