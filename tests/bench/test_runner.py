"""The benchmark end to end on a tiny budget: real trainer, tiny model, local search.

One benchmark of 2 variants x 2 seeds (a smoke run: 1 step each), the second
variant given as a run config file; then the state a killed run leaves (a
directory without `bench_run.json`) is redone while the finished runs are
reused.
"""

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
    "trainer.eval_every=1",  # evaluations at step 0 and 1: a held-out curve of two points
    "trainer.eval_tasks=2",
    "trainer.eval_samples=2",
    "trainer.checkpoint_every=1",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.mark.slow
def test_tiny_benchmark_tables_plots_and_resume(tmp_path, tiny_model_path, capsys):
    out = tmp_path / "bench"
    (tmp_path / "arpo_run.yaml").write_text(
        yaml.safe_dump({"model": {"path": str(tiny_model_path)}, "algorithm": {"name": "arpo", "initial_rollouts": 1}})
    )
    cfg = {
        "name": "tiny",
        "output_dir": str(out),
        "seeds": [0, 1],
        "smoke": True,
        "base": {"model": {"path": str(tiny_model_path)}},
        "variants": {
            "grpo": {"algorithm": {"name": "grpo"}},
            "arpo_hard": {"config": "arpo_run.yaml", "algorithm": {"advantage": "hard"}},  # a run config file
        },
        "probe": {"tasks": 2, "samples": 1, "positions": 50, "base_model": True},
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    result = run_benchmark(path, TINY_BUDGET)

    captured = capsys.readouterr()
    # the plan and its estimate come first, from the prior (nothing finished yet)
    assert "plan: 2 variants x 2 seeds = 4 runs (0 reused, 4 to train)" in captured.err
    assert "estimated wall time:" in captured.err and "prior: " in captured.err
    assert captured.err.index("plan:") < captured.err.index("training into")
    printed = captured.out
    assert "| grpo | grpo | 2 |" in printed and "| arpo_hard | arpo | 2 |" in printed
    assert "Paired: for each seed every variant trained on the same task batches (1 steps" in printed
    assert (out / "results.md").read_text() == result.markdown

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["variant"] for r in rows] == ["grpo", "arpo_hard"]
    acc = {}
    for row in rows:
        evals = []
        for seed in (0, 1):
            run_dir = out / "runs" / row["variant"] / f"seed{seed}"
            ev = json.loads((run_dir / "eval.json").read_text())
            assert ev["n_tasks"] == 2 and ev["n_samples"] == 4
            evals.append(ev)
            records = read_metrics(run_dir / "metrics.jsonl")
            assert sorted(r["step"] for r in records if "eval/accuracy" in r) == [0, 1]
            steps = [r for r in records if "rollout/reward" in r]
            assert len(steps) == 1 and "rollout/tool_results_per_group" in steps[0]
            probe = json.loads((run_dir / "probe.json").read_text())
            assert probe["episodes"] == 2 and len(probe["after_tool"]["sums"]) == 50
        acc[row["variant"]] = [e["accuracy"] for e in evals]
        assert float(row["heldout_accuracy_mean"]) == pytest.approx(sum(acc[row["variant"]]) / 2, abs=1e-5)
        assert "1:" in row["pass_at"] and "2:" in row["pass_at"]
        assert row["by_kind"].startswith("twohop:")
        assert float(row["wall_s_mean"]) > 0
    diffs = [b - a for a, b in zip(acc["grpo"], acc["arpo_hard"])]
    assert float(rows[1]["diff_vs_first_mean"]) == pytest.approx(sum(diffs) / 2, abs=1e-5)
    assert rows[0]["diff_vs_first_mean"] == ""  # the first variant is the reference

    for name in ("heldout_accuracy", "reward_curves", "tool_calls", "entropy_after_tool"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        from matplotlib.image import imread

        img = imread(png)
        h, w, _ = img.shape
        assert h > 100 and w > 100
        rgb = img[..., :3]
        # both variants drawn (tab10 blue and orange). The entropy plot's curves are as long as the sampled
        # segments reach (positions fewer than 3 reach are left out: 46 pixels on one CPU, more on another); its
        # legend's sample of each drawn line is there whatever was sampled: 2 x 7 pt long, 1.6 pt wide at
        # 100 dpi, ~19 x 2 pixels of the exact colour.
        least = 15 if name == "entropy_after_tool" else 50
        for color in ((0.12, 0.47, 0.71), (1.0, 0.5, 0.05)):
            assert (abs(rgb - color).sum(-1) < 0.1).sum() > least, (name, color)
        assert f"({png.name})" in result.markdown

    # a killed run leaves a directory without bench_run.json (written last): it is trained again, the rest reused
    killed = out / "runs" / "arpo_hard" / "seed1"
    (killed / "bench_run.json").unlink()
    (killed / "probe.json").unlink()
    mtime = (out / "runs" / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns
    again = run_benchmark(path, TINY_BUDGET)
    err = capsys.readouterr().err
    assert "plan: 2 variants x 2 seeds = 4 runs (3 reused, 1 to train)" in err
    assert "arpo_hard            seed 1    redo   (partial: killed before it finished" in err
    assert "measured: 1 finished arpo_hard run(s)" in err  # the estimate now comes from the finished runs
    assert err.count("reusing") == 3 and "training again (partial" in err
    assert (out / "runs" / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns == mtime
    assert (killed / "bench_run.json").exists() and (killed / "probe.json").exists()
    assert [r.eval["accuracy"] for r in again.runs][:3] == [r.eval["accuracy"] for r in result.runs][:3]
