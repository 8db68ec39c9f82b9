"""The report on hand-built runs: intervals and the marked paired difference in the table, the pairing check,
and the plots (files written, not blank)."""

from __future__ import annotations

import csv
import json

import pytest

from agentenv.bench.config import bench_config_from_dict
from agentenv.bench.report import evaluation_table, fmt_interval, pairing_check, write_report
from agentenv.bench.results import Probe, RunResult
from agentenv.bench.stats import Interval, PositionEntropy

ACC = {"a": [0.20, 0.30, 0.40], "b": [0.25, 0.36, 0.44]}  # b - a: +0.05, +0.06, +0.04 -> 0.05 [0.025, 0.075] *


def _run(tmp_path, variant: str, seed: int, batches=None, eval_seed=None) -> RunResult:
    d = tmp_path / "runs" / variant / f"seed{seed}"
    d.mkdir(parents=True)
    steps = batches or {1: ["t1", "t2"], 2: ["t3", "t4"]}
    (d / "batches.jsonl").write_text("".join(json.dumps({"step": s, "tasks": t}) + "\n" for s, t in steps.items()))
    cfg = {"trainer": {"seed": seed, "eval_seed": eval_seed, "steps": 2, "tasks_per_step": 2, "eval_tasks": 4},
           "algorithm": {"group_size": 4}, "env": {"tools": ["search"]}}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    acc = ACC[variant][seed]
    calls = 8.0 if variant == "a" else 4.0
    records = [{"step": 0, "eval/accuracy": acc - 0.1}]
    for s in (1, 2):
        records.append({"step": s, "rollout/reward": 0.1 * s + seed, "rollout/tool_calls_per_traj": 1.0 + s,
                        "rollout/tool_results_per_group": calls, "rollout/gen_tokens_per_group": 300.0,
                        "time/step_s": 10.0, "rollout/entropy": 0.5})  # fmt: skip
        if variant == "b":  # an ARPO run logs what its trees did
            records[-1].update({"arpo/branches_per_tree": 1.0 + s, "arpo/branch_points_per_traj": 0.25,
                                "arpo/delta_h_after_tool": 0.1, "arpo/delta_h_at_branch": 0.3,
                                "arpo/branch_share_of_tools": 0.25, "arpo/budget_out": 0.5})  # fmt: skip
            # and a GiGPO one its anchor groups (arpo_gigpo logs both)
            records[-1].update({"train/gigpo/steps": 12.0, "train/gigpo/anchor_share": 0.5 + 0.1 * s + 0.01 * seed,
                                "train/gigpo/step_adv_std": 0.4 + 0.2 * s, "train/gigpo/step_adv_abs_mean": 0.3})  # fmt: skip
    records.append({"step": 2, "eval/accuracy": acc})
    top = 2.0 if variant == "a" else 3.0  # apart, so neither line hides the other
    h = PositionEntropy([top - 0.02 * i for i in range(50)], [4] * 50)
    probe = Probe(h, PositionEntropy([1.0] * 50, [4] * 50), 8, 1.5)
    ev = {"accuracy": acc, "pass_at": {"1": acc, "2": acc + 0.1}, "by_kind": {"arith": acc, "twohop": acc / 2},
          "n_tasks": 4, "tool_calls": 1.0}  # fmt: skip
    return RunResult(variant, seed, "grpo" if variant == "a" else "arpo", d, 60.0, ev, records, probe, 30.0)


def test_fmt_interval():
    assert fmt_interval(Interval(0.3, 0.051586, 0.548414, 3)) == "0.300 [0.052, 0.548]"
    assert fmt_interval(Interval(0.05, 0.025, 0.075, 3), signed=True) == "+0.050 [0.025, 0.075] *"
    assert fmt_interval(Interval(0.05, -0.01, 0.11, 3), signed=True) == "+0.050 [-0.010, 0.110]"
    assert fmt_interval(Interval(-0.017, -0.017, -0.017, 3), signed=True) == "-0.017 [all 3 seeds equal]"
    assert fmt_interval(None) == "—"


def test_pairing_check_finds_other_batches_and_eval_seeds(tmp_path):
    runs = [_run(tmp_path, v, s) for v in ("a", "b") for s in (0, 1)]
    assert pairing_check(runs) == []
    (tmp_path / "x").mkdir()
    bad = [_run(tmp_path / "x", "a", 0), _run(tmp_path / "x", "b", 0, batches={1: ["t1", "t2"], 2: ["t9", "t4"]}),
           _run(tmp_path / "x", "a", 1), _run(tmp_path / "x", "b", 1, eval_seed=7)]  # fmt: skip
    problems = pairing_check(bad)
    assert problems == [
        "seed 0: b trained on other tasks than a at steps 2",
        "seed 1: b evaluated with seed 7, a with 1",
    ]


def test_report_table_intervals_marked_difference_and_plots(tmp_path):
    runs = [_run(tmp_path, v, s) for v in ("a", "b") for s in (0, 1, 2)]
    bench = bench_config_from_dict({"name": "hand", "output_dir": str(tmp_path), "variants": {"a": {}, "b": {}}})
    md, files = write_report(bench, runs, None)
    # a: mean 0.3, half 0.248414; b: 0.35, std 0.095394, half 0.236973; b - a: 0.05 [0.025159, 0.074841], marked
    assert "| a | grpo | 3 | 0.300 [0.052, 0.548] | — |" in md
    assert "| b | arpo | 3 | 0.350 [0.113, 0.587] | +0.050 [0.025, 0.075] * |" in md
    assert "4.0 ± 0.0 (0.50x)" in md  # the tree's tool calls per group against the first variant's 8
    # what the trees did, beside the tool calls (the last step of 2: 1 + 2 branches per tree); GRPO has no tree
    assert "(0.50x) | 3.0 br/tree, 0.25 bp/traj, ΔH +0.100 / +0.300, 25% of calls, out 50% |" in md
    assert "8.0 ± 0.0 (1.00x) | — |" in md
    # GiGPO's anchors over the last step and the seeds: share 0.7 + 0.01 * (0, 1, 2) -> 71%, std 0.8; none for GRPO
    assert "out 50% | anchors 71%, A^S std 0.80, mean \\|A^S\\| 0.30 |" in md
    assert "8.0 ± 0.0 (1.00x) | — | — |" in md
    assert "| a | 0.300 [0.052, 0.548] | 0.150 [0.026, 0.274] | 0.300 [0.052, 0.548] | 0.400 [0.152, 0.648] |" in md
    assert "Paired: for each seed every variant trained on the same task batches (2 steps" in md
    rows = list(csv.DictReader(files["csv"].open()))
    assert float(rows[1]["diff_vs_first_ci_low"]) == pytest.approx(0.025159, abs=1e-5)
    assert rows[1]["diff_vs_first_excludes_0"] == "1"
    assert float(rows[0]["wall_s_mean"]) == pytest.approx(90.0)  # training 60 + probe 30
    assert rows[0]["arpo_branches_per_tree_mean"] == "nan" and float(rows[1]["arpo_budget_out_mean"]) == 0.5
    assert rows[0]["gigpo_anchor_share_mean"] == "nan"
    assert float(rows[1]["gigpo_anchor_share_mean"]) == pytest.approx(0.71)
    assert float(rows[1]["gigpo_anchor_share_std"]) == pytest.approx(0.01)
    assert float(rows[1]["gigpo_step_adv_std_mean"]) == pytest.approx(0.8)
    from matplotlib.image import imread

    for name in ("heldout_accuracy", "reward_curves", "tool_calls", "entropy_after_tool"):
        png = files[name]
        assert png.exists() and png.stat().st_size > 10_000
        img = imread(png)
        assert img.shape[0] > 100 and img.std() > 0.05  # lines, labels and axes, not a blank canvas
        # the two variants' colors (tab10 blue and orange) are drawn
        rgb = img[..., :3]
        for color in ((0.12, 0.47, 0.71), (1.0, 0.5, 0.05)):
            assert (abs(rgb - color).sum(-1) < 0.1).sum() > 50, (name, color)


def _control_report(tmp_path, control_acc: list[float], variants: str) -> str:
    """The report of `variants` (a, [b,] c) over seeds 0-2, c the control with these accuracies."""
    ACC["c"] = control_acc
    try:
        runs = [_run(tmp_path, v, s) for v in variants for s in (0, 1, 2)]
        bench = bench_config_from_dict({"name": "hand", "output_dir": str(tmp_path), "control": "c",
                                        "variants": {v: {} for v in variants}})  # fmt: skip
        return write_report(bench, runs, None)[0]
    finally:
        del ACC["c"]


def test_resolution_control_outside_the_interval_and_the_detectable_difference(tmp_path):
    """a = reference, b = +0.05 (sd of the differences 0.01), c = the control: -0.10, -0.12, -0.08 (resolved)."""
    md = _control_report(tmp_path, [0.10, 0.18, 0.32], "abc")
    # all nine accuracies: mean 0.2833; 4 tasks: sqrt(p(1-p)/4) = 0.2251
    assert "binomial standard error of ±22.5 points (accuracy 0.28, 4 tasks" in md
    # b - a = 0.05, 0.06, 0.04: sd 0.01; (t_.975,2 4.3027 + t_.8,2 1.0607) * 0.01 / sqrt 3 = 0.0310
    assert "1.0 points; with 3 seeds the smallest difference from a this design detects" in md
    assert "80% power) is 3.3 points." in md
    assert "Positive control c: -0.100 [-0.150, -0.050] * against a, below 0 outside the 95% interval" in md


def test_a_control_inside_the_interval_says_the_bench_resolves_nothing(tmp_path):
    md = _control_report(tmp_path, [0.25, 0.20, 0.45], "ac")  # -> +0.05, -0.10, +0.05
    assert "Positive control c: +0.000 [" in md and "THIS BENCH RESOLVES NOTHING" in md


def test_a_control_whose_seeds_all_lose_by_the_same_amount_resolves_nothing(tmp_path):
    """Every seed -0.05: a zero-width 'interval' below 0 is no interval (measured: 2 seeds of 30 tasks did this)."""
    md = _control_report(tmp_path, [0.15, 0.25, 0.35], "ac")
    assert "Positive control c: -0.050 [all 3 seeds equal] against a; its interval" in md
    assert "THIS BENCH RESOLVES NOTHING" in md


def test_control_must_be_a_later_variant():
    from agentenv.errors import ConfigError

    with pytest.raises(ConfigError, match="control.*'z' is not a variant"):
        bench_config_from_dict({"control": "z", "variants": {"a": {}, "b": {}}})
    with pytest.raises(ConfigError, match="control.*'a' is the first variant"):
        bench_config_from_dict({"control": "a", "variants": {"a": {}, "b": {}}})


def test_report_only_rewrites_the_report_from_runs_an_older_config_made(tmp_path):
    """`bench --report-only` reads every finished run whatever config made it (no retraining), and names a
    missing one."""
    from agentenv.bench.runner import RUN_FILE, report_only
    from agentenv.errors import ConfigError

    bench = bench_config_from_dict({"name": "hand", "output_dir": str(tmp_path), "variants": {"a": {}, "b": {}}})
    for v in ("a", "b"):
        for s in (0, 1, 2):
            r = _run(tmp_path, v, s)
            (r.output_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r.records))
            (r.output_dir / "eval.json").write_text(json.dumps(r.eval))
            meta = {"variant": v, "seed": s, "wall_s": 60.0, "probe_s": 30.0, "config": {"from": "older code"}}
            (r.output_dir / RUN_FILE).write_text(json.dumps(meta))
    result = report_only(bench)
    assert [(r.variant, r.seed) for r in result.runs] == [(v, s) for s in (0, 1, 2) for v in ("a", "b")]
    md = (tmp_path / "results.md").read_text()
    assert md == result.markdown and "+0.050 [0.025, 0.075] *" in md
    assert "anchors 71%, A^S std 0.80" in md
    (tmp_path / "runs" / "b" / "seed1" / RUN_FILE).unlink()
    with pytest.raises(ConfigError, match=f"no finished run .*{tmp_path / 'runs' / 'b' / 'seed1'}"):
        report_only(bench)


def test_the_evaluation_table_pairs_task_by_task_over_seeds_sampled_and_greedy(tmp_path):
    """Per-task records in eval.json: b is right on 3 of 4 tasks where a is right on 2 (every seed), so the
    crossed bootstrap's every replicate is a mean of +0.25-or-so differences; greedy, b gains nothing."""
    runs = []
    for v in "ab":
        for sd in (0, 1, 2):
            r = _run(tmp_path, v, sd)
            right = {"a": [1, 1, 0, 0], "b": [1, 1, 1, 0]}[v]
            r.eval["per_task"] = [{"task": f"t{i}", "correct": [bool(c)], "tool_calls": 2} for i, c in enumerate(right)]
            r.eval["tool_calls"] = 2.0  # per sample (one per task here)
            r.eval["greedy"] = {"n_tasks": 4, "n_samples": 4, "tool_calls": 1.0,
                                "per_task": [{"task": f"t{i}", "correct": [i < 2], "tool_calls": 1} for i in range(4)]}
            runs.append(r)
    table = evaluation_table(runs)
    rows = ([x.strip() for x in line.strip("|").split("|")] for line in table.splitlines()[2:])
    lines = {(c[0], c[1]): c for c in rows}  # (variant, evaluation) -> accuracy, difference, tool calls per answer
    sampled = "sampled at T=?, eval_seed fixed"  # the hand-made config.json names no temperature
    assert lines["b", sampled][3].startswith("+0.250 [") and lines["b", sampled][3].endswith("(3 seeds x 4 tasks)")
    assert lines["a", sampled][2] == "0.500 [all 3 seeds equal]" and lines["a", sampled][3] == "—"
    assert lines["a", sampled][4] == "2.00 [all 3 seeds equal]"
    assert lines["b", "greedy (T=0)"][3] == "+0.000 [every difference equal] (3 seeds x 4 tasks)"
    assert lines["a", "greedy (T=0)"][4] == "1.00 [all 3 seeds equal]"
    assert evaluation_table([_run(tmp_path / "x", "a", 0)]) == ""  # no per-task records: no table


def test_crossed_bootstrap_resamples_seeds_and_tasks():
    import numpy as np

    from agentenv.bench.stats import crossed_bootstrap

    same = crossed_bootstrap(np.full((3, 5), 0.2))
    assert (same.mean, same.low, same.high) == pytest.approx((0.2, 0.2, 0.2))
    d = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])  # mean 0.375
    a, b = crossed_bootstrap(d), crossed_bootstrap(d)
    assert a == b and a.low < 0.375 < a.high and a.n == 8  # seeded: the same interval
    wider = crossed_bootstrap(np.vstack([d, [[5.0, -5.0, 5.0, -5.0]]]))  # a seed far off widens it
    assert wider.high - wider.low > a.high - a.low
    with pytest.raises(ValueError):
        crossed_bootstrap(np.array([1.0, 2.0]))
