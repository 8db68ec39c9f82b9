"""The plan printed before a benchmark: which runs train, are reused or redone, and the estimated wall time."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from agentenv.bench.config import bench_config_from_dict, resolve_runs
from agentenv.bench.runner import (
    PRIOR_EVAL_SAMPLE_S,
    PRIOR_START_S,
    PRIOR_TRAJ_S,
    RUN_FILE,
    Probe,
    evaluations_per_run,
    plan_runs,
    show_plan,
)
from agentenv.bench.stats import PositionEntropy
from agentenv.cli import app
from agentenv.errors import ConfigError


def _bench(tmp_path, **extra):
    raw = {
        "name": "p",
        "output_dir": str(tmp_path / "out"),
        "seeds": [0, 1, 2],
        "base": {
            "algorithm": {"name": "grpo", "group_size": 4},
            "trainer": {"steps": 5, "tasks_per_step": 2, "mini_batch_tasks": 2, "eval_every": 2, "eval_tasks": 10,
                        "eval_samples": 2},  # fmt: skip
        },
        "variants": {"a": {}, "b": {"algorithm": {"normalize_std": False}}},
        "probe": {"tasks": 4, "samples": 2, "seeds": [0], "base_model": False},
        **extra,
    }
    return bench_config_from_dict(raw)


def _finish(spec, bench, wall_s: float, probe_s: float, config=None) -> None:
    """What `train_run` leaves behind (bench_run.json last), with chosen times."""
    d = spec.output_dir
    d.mkdir(parents=True)
    (d / "eval.json").write_text(json.dumps({"accuracy": 0.5, "n_tasks": 10}))
    (d / "metrics.jsonl").write_text("")
    if probe_s:
        empty = PositionEntropy.zeros(50)
        (d / "probe.json").write_text(json.dumps(Probe(empty, empty).to_dict()))
    meta = {
        "variant": spec.variant,
        "seed": spec.seed,
        "wall_s": wall_s,
        "probe_s": probe_s,
        "config": config if config is not None else spec.config.to_dict(),
        "probe": dataclasses.asdict(bench.probe),
    }
    (d / RUN_FILE).write_text(json.dumps(meta, default=str))


def test_evaluations_per_run_counts_start_middle_and_end(tmp_path):
    cfg = resolve_runs(_bench(tmp_path))[0].config
    assert evaluations_per_run(cfg) == 4  # steps 0, 2, 4 and the final 5
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, eval_every=0))
    assert evaluations_per_run(cfg) == 1


def test_plan_from_the_prior_when_nothing_finished(tmp_path):
    bench = _bench(tmp_path)
    text = show_plan(bench)
    assert text.startswith("plan: 2 variants x 3 seeds = 6 runs (0 reused, 6 to train)")
    # a run: start + 5 steps x 2 tasks x 4 trajectories + 4 evaluations x 10 tasks x 2 samples; seed 0 also probes
    run = PRIOR_START_S + 40 * PRIOR_TRAJ_S + 80 * PRIOR_EVAL_SAMPLE_S
    probe = PRIOR_START_S + 8 * PRIOR_EVAL_SAMPLE_S
    plan, _ = plan_runs(bench, resolve_runs(bench))
    assert [p.estimate_s for p in plan] == pytest.approx([run + probe] * 2 + [run] * 4)  # seed by seed
    assert f"estimated wall time: {(6 * run + 2 * probe) / 60:.1f} min (per run: prior: " in text


def test_plan_shows_each_variants_algorithm_as_merged(tmp_path):
    """A base's algorithm fields carry over to a variant that names another algorithm: the plan says so."""
    bench = _bench(tmp_path, variants={"a": {}, "b": {"algorithm": {"normalize_std": False}},
                                       "d": {"algorithm": {"name": "dapo"}}})  # fmt: skip
    lines = show_plan(bench).splitlines()
    assert "  a                    grpo group_size=4" in lines
    assert "  b                    grpo group_size=4 normalize_std=False" in lines
    assert "  d                    dapo group_size=4" in lines  # DAPO's own defaults (token_mean) kept
    bench = _bench(tmp_path, base={"algorithm": {"loss_agg": "seq_mean_token_mean"}}, variants={"d": {"algorithm": {"name": "dapo"}}})
    assert "  d                    dapo loss_agg=seq_mean_token_mean" in show_plan(bench).splitlines()
    bench = _bench(tmp_path, base={}, variants={"g": {}})
    assert "  g                    grpo (its defaults)" in show_plan(bench).splitlines()


def test_plan_reuses_finished_redoes_killed_and_estimates_from_measured_runs(tmp_path):
    bench = _bench(tmp_path)
    specs = {(s.variant, s.seed): s for s in resolve_runs(bench)}
    _finish(specs["a", 0], bench, wall_s=100.0, probe_s=30.0)
    _finish(specs["a", 1], bench, wall_s=120.0, probe_s=0.0)
    killed = specs["a", 2].output_dir  # a killed run: its files, but no bench_run.json (written last)
    killed.mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"step": 1, "rollout/reward": 0.1}\n')
    other = specs["b", 0].config.to_dict()
    other["trainer"]["lr"] = 0.5
    _finish(specs["b", 0], bench, wall_s=999.0, probe_s=0.0, config=other)  # made by another config

    plan, finished = plan_runs(bench, list(specs.values()))
    status = {(p.spec.variant, p.spec.seed): (p.status, p.estimate_s) for p in plan}
    assert [(r.variant, r.seed) for r in finished] == [("a", 0), ("a", 1)]
    assert status["a", 0] == ("reuse", 0.0) and status["a", 1] == ("reuse", 0.0)
    assert status["a", 2] == ("redo", pytest.approx(110.0))  # mean wall of the finished a runs; seed 2 not probed
    assert status["b", 0] == ("redo", pytest.approx(110.0 + 30.0))  # no b finished: all finished runs + the probe
    assert status["b", 1] == ("train", pytest.approx(110.0))

    text = show_plan(bench)
    assert "(2 reused, 4 to train)" in text
    assert "a                    seed 2    redo   (partial: killed before it finished (no bench_run.json), ~1.8 min)" in text
    assert "b                    seed 0    redo   (made by another config or probe, ~2.3 min)" in text
    assert "measured: 2 finished a run(s)" in text and "measured: 2 finished run(s) of other variants" in text
    assert f"estimated wall time: {(110 + 140 + 110 + 110) / 60:.1f} min" in text
    # the finished runs took 100 and 120 s: the total scaled to the fastest and the slowest
    assert "the finished runs took 1.7-2.0 min each: 7.1-8.5 min at their fastest and slowest" in text

    off = _bench(tmp_path, reuse=False)
    assert "(0 reused, 6 to train)" in show_plan(off)


def test_cli_plan_prints_and_runs_nothing(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "seeds": [0, 1, 2], "variants": {"g": {}}}))
    res = CliRunner().invoke(app, ["bench", str(path), "--plan", "trainer.steps=1"])
    assert res.exit_code == 0, res.output
    assert "plan: 1 variants x 3 seeds = 3 runs" in res.output and "estimated wall time" in res.output
    assert not (tmp_path / "out" / "runs").exists()
    bad = CliRunner().invoke(app, ["bench", str(path), "--plan", "seeds=[0]"])
    assert bad.exit_code == 2 and "smoke=true" in bad.output


def test_plan_on_ray_divides_by_the_runs_at_once(tmp_path):
    text = show_plan(_bench(tmp_path, ray={"address": "auto", "max_parallel": 3, "num_cpus": 2}))
    run = PRIOR_START_S + 40 * PRIOR_TRAJ_S + 80 * PRIOR_EVAL_SAMPLE_S
    total = 6 * run + 2 * (PRIOR_START_S + 8 * PRIOR_EVAL_SAMPLE_S)
    assert f"on Ray (auto), 3 runs at once: ~{total / 3 / 60:.1f} min if the cluster holds 3 x (2 CPUs, 0 GPUs)" in text
    text = show_plan(_bench(tmp_path, ray={"address": "auto"}))
    assert "the time above is the sequential sum, an upper bound" in text
    assert "on Ray" not in show_plan(_bench(tmp_path))
    with pytest.raises(ConfigError, match="ray.max_parallel"):
        _bench(tmp_path, ray={"address": "auto", "max_parallel": -1})


def test_a_run_killed_while_writing_its_marker_is_trained_again(tmp_path):
    """A kill while `bench_run.json` was being written leaves it torn: the run is unfinished (trained again),
    and the plan does not stop on the torn file."""
    bench = _bench(tmp_path)
    specs = resolve_runs(bench)
    _finish(specs[0], bench, 60.0, 0.0)
    _finish(specs[1], bench, 60.0, 0.0)
    marker = specs[1].output_dir / RUN_FILE
    marker.write_text(marker.read_text()[:40])  # torn mid-write
    plan, finished = plan_runs(bench, specs)
    assert [(r.variant, r.seed) for r in finished] == [(specs[0].variant, specs[0].seed)]
    assert [(p.status, p.reason) for p in plan[:2]][1] == ("redo", "partial: killed while writing bench_run.json")
    assert plan[0].status == "reuse"
