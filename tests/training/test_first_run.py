"""A newcomer's first run: a cold sandbox gives a correct first evaluation, and the main command exits clean.

The cold condition (see tests/tools/python_sandbox/test_cold_start.py): a sandbox
pool whose start takes longer than `env.tool_timeout_s`. The run's health check
starts and warms every tool before the first evaluation, so none of its calls
times out; the run then leaves no container and prints no asyncio warning.
"""

from __future__ import annotations

import json
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
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _left_behind(before: set[str]) -> list[str]:
    """Containers made since `before` whose owner process is gone (a run's leftovers). Those of a live owner, such as
    another test's pool running beside this one (pytest -n), are not the finished run's."""
    import docker

    from agentenv.tools.python_sandbox.pool import _start_time

    label = PythonSandboxConfig.label
    left = []
    for c in docker.from_env(timeout=30).api.containers(all=True):
        if c["Id"] in before:
            continue
        owner = (c.get("Labels") or {}).get(f"{label}.owner", "")
        pid, _, rest = owner.partition(":")
        if not (pid.isdigit() and rest.split("@")[0] == _start_time(int(pid)) != "?"):
            left.append(f"{c['Id'][:12]} (owner {owner or 'none'})")
    return left


@pytest.mark.slow
@pytest.mark.vllm
def test_the_main_command_cut_to_two_small_steps_trains_on_vllm_and_exits_clean(tmp_path):
    """`agentenv train configs/toy_arpo.yaml` (policy.backend=vllm) cut to two small steps: it trains, pushes its
    weights into the engine, keeps the terminal quiet, prints no warning at exit and leaves no container.

    One run for what were two (each starting its own engine): this test's one-step run, and
    tests/training/test_vllm_backend.py's two steps of configs/toy_grpo.yaml on the vllm backend. The algorithm is
    no part of the backend's path (GRPO on vLLM workers: tests/distributed/test_ray_rollout.py)."""
    out = tmp_path / "run"
    before = _docker_ps()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentenv", "train", "configs/toy_arpo.yaml", "trainer.steps=2",
         "trainer.tasks_per_step=2", "trainer.mini_batch_tasks=2", "trainer.eval_tasks=3", "trainer.checkpoint_every=1",
         f"trainer.output_dir={out}", "logging.progress=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="default"),
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    for noise in ("Task was destroyed", "was never awaited", "Exception ignored", "Traceback", "Task exception"):
        assert noise not in stderr, stderr[-3000:]
    assert _left_behind(before) == []
    # A quiet terminal: the engine's processes and loggers write to the run's engine.log instead.
    terminal = stdout + stderr
    engine_log = (out / "engine.log").read_text()
    assert "EngineCore" in engine_log and "Successfully reset prefix cache" in engine_log  # start, weight push
    for noise in ("EngineCore", "Worker pid", "INFO", "Loading weights", "Writing model shards", "Removed shared"):
        assert noise not in terminal, terminal[-4000:]
    assert len(terminal.splitlines()) < 25, terminal
    # The weight pushes reload every layer without vLLM's "RotaryEmbedding: Failed to load weights".
    assert "Failed to load weights" not in engine_log
    report = json.loads(stdout[stdout.index("{") :])
    assert report["output_dir"] == str(out) and 0.0 <= report["heldout_accuracy"] <= 1.0
    assert 0.0 <= report["heldout_accuracy_at_start"] <= 1.0
    records = [r for r in read_metrics(out / "metrics.jsonl") if "rollout/reward" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/failed"] == 0
        assert r["rollout/gen_tokens_per_group"] > 0 and r["rollout/entropy"] > 0
        # vLLM sampled in fp32 from the trainer's weights (pushed after step 1): the gap stays small
        assert r["train/logprob_gap_mean"] < 1e-2, r
    assert (out / "checkpoints" / "step_000002" / "model" / "config.json").exists()
    # the rollout record (`agentenv view`'s): every step and evaluation, each policy token with its weight version
    from agentenv.view.loader import Folder

    run = Folder.open(out).run(".")
    assert [(f["split"], f["step"]) for f in run.rollout_files().data] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    versions = []
    for step in (1, 2):
        got = run.groups("train", step)
        assert got.problems == [] and got.data["total"] == 2
        policy = [s for g in got.data["groups"] for t in g["trajectories"] for s in t["segments"] if s["source"] == "policy"]
        assert policy and all(len(s["versions"]) == len(s["ids"]) for s in policy)
        versions.append({v for s in policy for v in s["versions"]})
    assert len(versions[0]) == len(versions[1]) == 1 and max(versions[1]) == max(versions[0]) + 1  # one push between


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
    assert _left_behind(before) == []
