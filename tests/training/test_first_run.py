"""A newcomer's first run: a cold sandbox gives a correct first evaluation, and the main command exits clean.

The cold condition (see tests/tools/python_sandbox/test_cold_start.py): a sandbox
pool whose start takes longer than `env.tool_timeout_s`. The run's health check
starts and warms every tool before the first evaluation, so none of its calls
times out; the run then leaves no container and prints no asyncio warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentenv.configs import config_from_dict
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.tools.python_sandbox import PythonSandboxConfig
from agentenv.training.build import build_runtime
from agentenv.training.metrics import read_metrics
from agentenv.training.trainer import Trainer

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def test_a_cold_sandbox_gives_a_correct_first_evaluation(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + [
        "env.tasks.kinds=[arith]",  # a start of 6 s is longer than a call may take (2 s)
        "env.tools={python: {pool_size: 2, preload: [], warmup: 'import time; time.sleep(6)'}}", "env.tool_timeout_s=2",
        "trainer.steps=1", "trainer.eval_every=1",
    ])  # fmt: skip
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))

    def turn(prompt_ids: list[int]) -> str:
        text = rt.tokenizer.decode(prompt_ids)
        return "<answer>\\boxed{0}</answer>" if "done 2" in text else '<python>print("done", 1 + 1)</python>'

    rt.policy = ScriptedPolicy(rt.tokenizer, turn)
    trainer = Trainer(cfg, runtime=rt)
    trainer.train()
    first = next(r for r in read_metrics(Path(cfg.trainer.output_dir) / "metrics.jsonl") if r["step"] == 0)
    assert first["eval/tool_calls/python"] == 2  # eval_tasks=2, one call each
    assert first["eval/tool_errors/python/timeout"] == 0 and first["eval/tool_failed/python"] == 0.0, first


def _docker_ps() -> set[str]:
    out = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.slow
@pytest.mark.vllm
def test_the_main_commands_one_step_run_exits_clean(tmp_path):
    """`agentenv train configs/toy_arpo.yaml` cut to one small step: no warning at exit, no container left."""
    before = _docker_ps()
    proc = subprocess.run(
        [sys.executable, "-m", "agentenv", "train", "configs/toy_arpo.yaml", "trainer.steps=1",
         "trainer.tasks_per_step=2", "trainer.mini_batch_tasks=2", "trainer.eval_tasks=3",
         f"trainer.output_dir={tmp_path / 'run'}", "logging.progress=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="default"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in ("Task was destroyed", "was never awaited", "Exception ignored", "Traceback", "Task exception"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    assert '"heldout_accuracy"' in proc.stdout and '"heldout_accuracy_at_start"' in proc.stdout
    assert _docker_ps() == before


def test_a_run_whose_sandbox_cannot_start_stops_with_one_line(tmp_path):
    before = _docker_ps()
    proc = subprocess.run(
        [sys.executable, "-m", "agentenv", "train", "configs/toy_grpo.yaml", "policy.backend=hf",
         "env.tools.python.image=agentenv/no-such-image:missing", f"trainer.output_dir={tmp_path / 'run'}",
         "logging.progress=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "python tool failed its health check" in errors[0], proc.stderr[-2000:]
    assert "no-such-image" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or "eval/" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    assert _docker_ps() == before
