"""The benchmark end to end on a tiny budget: real trainer, tiny model, local search."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from agentenv.bench import run_benchmark
from agentenv.training.metrics import read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TINY_BUDGET = [
    "env.tools=[search]",
    "env.tasks.kinds=[twohop]",
    "env.max_context_tokens=768",
    "env.max_result_tokens=160",
    "policy.max_turn_tokens=48",
    "algorithm.group_size=2",
    "trainer.steps=1",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=4",
    "trainer.lr=0.001",
    "trainer.eval_tasks=2",
    "trainer.checkpoint_every=1",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.mark.slow
def test_tiny_benchmark_writes_consistent_tables_and_plots(tmp_path, tiny_model_path, capsys):
    out = tmp_path / "bench"
    cfg = {
        "name": "tiny",
        "output_dir": str(out),
        "seeds": [0],
        "base": {"model": {"path": str(tiny_model_path)}},
        "variants": {
            "grpo": {"algorithm": {"name": "grpo"}},
            "arpo_hard": {"algorithm": {"name": "arpo", "initial_rollouts": 1, "advantage": "hard"}},
        },
        "probe": {"tasks": 2, "samples": 1, "positions": 50, "base_model": True},
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    result = run_benchmark(path, TINY_BUDGET)

    printed = capsys.readouterr().out
    assert "| grpo | grpo |" in printed and "| arpo_hard | arpo |" in printed
    assert "| rollout s/step | old-lp s/step | update s/step | push s/step |" in printed
    assert (out / "results.md").read_text() == result.markdown

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["variant"] for r in rows] == ["grpo", "arpo_hard"]
    for row in rows:
        run_dir = out / "runs" / row["variant"] / "seed0"
        ev = json.loads((run_dir / "eval.json").read_text())
        assert ev["n_tasks"] == 2
        assert float(row["heldout_accuracy_mean"]) == pytest.approx(ev["accuracy"], abs=1e-5)
        assert float(row["heldout_accuracy_min"]) == pytest.approx(ev["accuracy"], abs=1e-5)
        assert float(row["heldout_accuracy_std"]) == 0.0
        steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "rollout/reward" in r]
        assert len(steps) == 1
        assert float(row["reward_mean"]) == pytest.approx(steps[0]["rollout/reward"], abs=1e-5)
        gen = steps[0]["rollout/gen_tokens_per_group"]
        assert float(row["gen_tokens_per_group_mean"]) == pytest.approx(gen, rel=1e-5)
        assert float(row["train_s_mean"]) == pytest.approx(steps[0]["time/step_s"], rel=1e-4)
        for part in ("rollout", "old_logprobs", "update", "push"):  # the step itemized, as the trainer logs it
            assert float(row[f"{part}_s_mean"]) == pytest.approx(steps[0][f"time/{part}_s"], rel=1e-4)
        assert float(row["wall_s_mean"]) > 0
        probe = json.loads((run_dir / "probe.json").read_text())
        assert probe["episodes"] == 2 and len(probe["after_tool"]["sums"]) == 50
        assert probe["after_prompt"]["counts"][0] == 2  # every episode has a first turn

    for name in ("reward_curves", "tool_calls", "entropy_after_tool"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        from matplotlib.image import imread

        h, w, _ = imread(png).shape
        assert h > 100 and w > 100
        assert f"({png.name})" in result.markdown

    # a rerun of the same config reuses the finished runs instead of training again
    mtime = (out / "runs" / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns
    again = run_benchmark(path, TINY_BUDGET)
    assert "reusing" in capsys.readouterr().err
    assert (out / "runs" / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns == mtime
    assert [r.eval["accuracy"] for r in again.runs] == [r.eval["accuracy"] for r in result.runs]
