"""Bad configs: each one is a single `error: <dotted key>: ...` line naming the value, exit code 2, no traceback.

Every case goes through the real `agentenv train` command, so the error is the
one a user sees: at config load for a bad range, at the start of the run for a
path or a size that only the filesystem or the tokenizer can judge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentenv.cli import app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def paths(tmp_path):
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a model")
    no_config = tmp_path / "empty_model"
    no_config.mkdir()
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("{not json\n")
    return {"file": a_file, "dir": no_config, "garbage": garbage, "missing": tmp_path / "missing.jsonl"}


JSONL = ["env.tools=[python]", "env.tasks={{source: jsonl}}"]  # tasks from a file (no toy corpus for search)

CASES = {
    # (overrides, key, text the message must hold); {file}, {dir}, ... are filled from `paths`
    "lr nan": (["trainer.lr=.nan"], "trainer.lr", "nan"),
    "lr inf": (["trainer.lr=.inf"], "trainer.lr", "inf"),
    "lr zero": (["trainer.lr=0"], "trainer.lr", "0"),
    "max_grad_norm negative": (["trainer.max_grad_norm=-1"], "trainer.max_grad_norm", "-1"),
    "max_grad_norm zero": (["trainer.max_grad_norm=0"], "trainer.max_grad_norm", "0"),
    "max_grad_norm inf": (["trainer.max_grad_norm=.inf"], "trainer.max_grad_norm", "inf"),
    "weight_decay nan": (["trainer.weight_decay=.nan"], "trainer.weight_decay", "nan"),
    "episode_timeout negative": (["rollout.episode_timeout_s=-5"], "rollout.episode_timeout_s", "-5"),
    "episode_timeout tiny": (["rollout.episode_timeout_s=0.001"], "rollout.episode_timeout_s", "0.001"),
    "episode_timeout nan": (["rollout.episode_timeout_s=.nan"], "rollout.episode_timeout_s", "nan"),
    "rollout_timeout moved": (["trainer.rollout_timeout_s=60"], "trainer.rollout_timeout_s", "rollout.episode_timeout_s"),
    "keep no checkpoint": (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints", "0"),
    "max_failed_steps zero": (["trainer.max_failed_steps=0"], "trainer.max_failed_steps", "0"),
    "temperature nan": (["policy.temperature=.nan"], "policy.temperature", "nan"),
    "tool timeout inf": (["env.tool_timeout_s=.inf"], "env.tool_timeout_s", "inf"),
    "model path missing": (["model.path=/nonexistent/model"], "model.path", "/nonexistent/model"),
    "model path is a file": (["model.path={file}"], "model.path", "is a file"),
    "model path holds no model": (["model.path={dir}"], "model.path", "holds no config.json"),
    "tasks file missing": ([*JSONL, "env.tasks.path={missing}"], "env.tasks.path", "does not exist"),
    "tasks file is a folder": ([*JSONL, "env.tasks.path={dir}"], "env.tasks.path", "is a folder"),
    "tasks file garbage": ([*JSONL, "env.tasks.path={garbage}"], "env.tasks.path", "not valid JSON"),
    "output_dir under a file": (["trainer.output_dir={file}/run"], "trainer.output_dir", "not writable"),
    "output_dir is a file": (["trainer.output_dir={file}"], "trainer.output_dir", "is a file"),
    # issue 29: each of these ran into a numpy or torch traceback, or finished (rc 0) with every trajectory failed
    "seed negative": (["trainer.seed=-1"], "trainer.seed", "-1"),
    "seed past 2**32": (["trainer.seed=4294967296"], "trainer.seed", "4294967296"),
    "seed 1e25": (["trainer.seed=10000000000000000000000000"], "trainer.seed", "10000000000000000000000000"),
    "eval seed negative": (["trainer.eval_seed=-1"], "trainer.eval_seed", "-1"),
    "device not a device": (["policy.hf.device=cuda:abc"], "policy.hf.device", "cuda:abc"),
    "model length below the context": (["policy.hf.max_model_len=16"], "policy.hf.max_model_len", "16 is below"),
    "context smaller than the prompts": (
        ["env.max_context_tokens=64", "env.max_result_tokens=16", "policy.max_turn_tokens=8"],
        "env.max_context_tokens", "-token prompt",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_config_is_one_line_naming_the_key(fast_overrides, paths, case):
    overrides, key, says = CASES[case]
    overrides = [o.format(**paths) for o in overrides]
    res = CliRunner().invoke(app, ["train", "configs/toy_grpo.yaml", *fast_overrides, *overrides])
    assert res.exit_code == 2, (res.exit_code, res.output[-3000:], res.exception)
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}: "), res.output[-2000:]
    assert says.format(**paths) in errors[0], errors[0]


def test_a_cuda_device_on_a_machine_without_one_is_one_line(fast_overrides, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this machine has
    res = CliRunner().invoke(app, ["train", "configs/toy_grpo.yaml", *fast_overrides, "policy.hf.device=cuda"])
    assert res.exit_code == 2 and "Traceback" not in res.output, (res.exit_code, res.output[-3000:], res.exception)
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert errors == ["error: policy.hf.device: 'cuda' asks for a GPU, but this machine has no CUDA device "
                      "(torch.cuda.is_available() is False); use auto or cpu"], res.output[-2000:]  # fmt: skip


def test_the_real_command_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "agentenv", "train", "configs/toy_grpo.yaml", "trainer.max_grad_norm=-1",
         f"trainer.output_dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: trainer.max_grad_norm: must be a finite number > 0, got -1.0"]
