"""Pure aggregation on hand-built inputs: t intervals, paired differences, pass@k over seeds, spreads, curves,
entropy by position after a tool result. Every expected number is worked out in the test."""

from __future__ import annotations

import math

import pytest

from agentenv.bench.report import early_mean, pool_probes, variant_rows
from agentenv.bench.results import Probe, RunResult
from agentenv.bench.stats import (
    PositionEntropy,
    by_kind_over_seeds,
    curve,
    entropy_by_position,
    eval_curve,
    final_mean,
    mean_curve,
    paired_differences,
    paired_interval,
    pass_at_k_over_seeds,
    spread,
    t_interval,
    t_quantile,
    t_two_sided_mass,
)
from agentenv.types import Segment, Trajectory


def pol(*h: float) -> Segment:
    return Segment("policy", list(range(len(h))), logprobs=[0.0] * len(h), entropies=list(h))


def tool(n: int = 3) -> Segment:
    return Segment("tool", [7] * n)


def prompt(n: int = 4) -> Segment:
    return Segment("prompt", [1] * n)


def test_spread_mean_sample_std_min_max():
    s = spread([0.25, 0.5, 0.75])
    assert s.mean == pytest.approx(0.5)
    assert s.std == pytest.approx(0.25)  # sample std: sqrt((0.0625*2)/2)
    assert (s.min, s.max, s.n) == (0.25, 0.75, 3)


def test_spread_single_seed_has_zero_std_and_skips_nan():
    s = spread([0.4, float("nan")])
    assert (s.mean, s.std, s.min, s.max, s.n) == (0.4, 0.0, 0.4, 0.4, 1)
    empty = spread([float("nan")])
    assert empty.n == 0 and math.isnan(empty.mean)


def test_entropy_by_position_counts_only_segments_after_tool_results():
    t1 = Trajectory("a", [prompt(), pol(9.0, 9.0), tool(), pol(1.0, 2.0, 3.0), tool(), pol(3.0)])
    t2 = Trajectory("b", [prompt(), pol(5.0), tool(), pol(2.0, 4.0)])
    pe = entropy_by_position([t1, t2], positions=4)
    # position 0: 1, 3, 2 -> mean 2; position 1: 2, 4 -> 3; position 2: 3; position 3: none
    assert pe.counts == [3, 2, 1, 0]
    assert pe.sums == pytest.approx([6.0, 6.0, 3.0, 0.0])
    assert pe.mean[:3] == pytest.approx([2.0, 3.0, 3.0])
    assert math.isnan(pe.mean[3])
    assert pe.segments == 3


def test_entropy_by_position_truncates_and_skips_failed_and_nonfinite():
    long = Trajectory("a", [prompt(), pol(0.5), tool(), pol(*[1.0] * 60)])
    failed = Trajectory("b", [prompt(), pol(0.5), tool(), pol(100.0)], failed=True)
    nonfinite = Trajectory("c", [prompt(), pol(0.5), tool(), pol(float("nan"), 3.0)])
    pe = entropy_by_position([long, failed, nonfinite], positions=50)
    assert len(pe.counts) == 50
    assert pe.counts[0] == 1 and pe.counts[1] == 2 and pe.counts[49] == 1
    assert pe.mean[1] == pytest.approx(2.0)


def test_entropy_after_prompt_is_the_first_turn():
    t = Trajectory("a", [prompt(), pol(4.0, 6.0), tool(), pol(1.0)])
    pe = entropy_by_position([t], positions=3, after="prompt")
    assert pe.counts == [1, 1, 0]
    assert pe.sums[:2] == [4.0, 6.0]


def test_position_entropy_pools_by_adding_and_round_trips():
    a = PositionEntropy([1.0, 2.0], [1, 1])
    b = PositionEntropy([3.0, 0.0], [1, 0])
    pooled = a + b
    assert pooled.mean == pytest.approx([2.0, 2.0])
    assert PositionEntropy.from_dict(pooled.to_dict()) == pooled
    with pytest.raises(ValueError, match="3 positions with 2"):
        _ = PositionEntropy.zeros(3) + a
    assert early_mean(pooled, k=2) == pytest.approx(6.0 / 3)
    assert math.isnan(early_mean(None))


RECORDS = [
    {"step": 0, "eval/accuracy": 0.1},
    {"step": 1, "rollout/reward": 0.0, "rollout/tool_calls_per_traj": 1.0},
    {"step": 3, "rollout/reward": 1.0, "rollout/tool_calls_per_traj": 3.0},
    {"step": 2, "rollout/reward": 0.5, "rollout/tool_calls_per_traj": 2.0},
    {"step": 3, "eval/accuracy": 0.9},
]


def test_curves_skip_eval_records_and_final_mean_uses_last_steps():
    assert curve(RECORDS, "rollout/reward") == {1: 0.0, 2: 0.5, 3: 1.0}
    assert final_mean(RECORDS, "rollout/reward", 2) == pytest.approx(0.75)
    assert final_mean(RECORDS, "rollout/reward", 10) == pytest.approx(0.5)
    assert math.isnan(final_mean(RECORDS, "rollout/missing", 2))


def test_mean_curve_over_steps_every_run_logged():
    steps, mean, lo, hi = mean_curve([{1: 0.0, 2: 1.0, 3: 1.0}, {1: 1.0, 2: 0.0}])
    assert steps == [1, 2]
    assert mean == [0.5, 0.5] and lo == [0.0, 0.0] and hi == [1.0, 1.0]


def _run(variant: str, seed: int, acc: float, reward: float, probe: Probe | None) -> RunResult:
    recs = [{"step": 1, "rollout/reward": 0.0}, {"step": 2, "rollout/reward": reward}]
    return RunResult(variant, seed, "grpo", None, 10.0 * (seed + 1), {"accuracy": acc, "tool_calls": 1.0}, recs, probe)


def test_variant_rows_aggregate_seeds_in_config_order():
    p1 = Probe(PositionEntropy([2.0] * 10, [1] * 10), PositionEntropy([1.0] * 10, [1] * 10), 2, 1.0)
    p2 = Probe(PositionEntropy([4.0] * 10, [1] * 10), PositionEntropy([1.0] * 10, [1] * 10), 2, 1.0)
    runs = [_run("b", 0, 0.5, 1.0, p1), _run("b", 1, 1.0, 0.0, p2), _run("a", 0, 0.0, 0.2, None)]
    rows = variant_rows(runs, last=1)
    assert [r.variant for r in rows] == ["b", "a"]
    b = rows[0]
    assert b.seeds == [0, 1]
    assert b.heldout_accuracy.mean == pytest.approx(0.75)
    assert (b.heldout_accuracy.min, b.heldout_accuracy.max) == (0.5, 1.0)
    assert b.rollout["reward"].mean == pytest.approx(0.5)  # last step of each seed: 1.0 and 0.0
    assert b.wall_s.mean == pytest.approx(15.0)
    assert b.entropy_after_tool == pytest.approx(3.0)  # pooled over seeds
    assert math.isnan(rows[1].entropy_after_tool)
    assert pool_probes([None], "after_tool") is None


# --------------------------------------------------------------------------- Student t
def test_t_quantile_closed_forms_and_table_values():
    # df 1 (Cauchy): P(|T| <= t) = 2 atan(t) / pi, so t = tan(0.95 pi / 2)
    assert t_quantile(0.95, 1) == pytest.approx(math.tan(0.95 * math.pi / 2), rel=1e-12)
    assert t_quantile(0.95, 1) == pytest.approx(12.7062, abs=1e-4)  # the printed table's value
    # df 2: P(|T| <= t) = t / sqrt(2 + t^2), so t = 0.95 sqrt(2 / (1 - 0.95^2)) = 4.3027
    assert t_quantile(0.95, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), rel=1e-12)
    # table values (two-sided 95%): df 4, 9, 30
    for df, table in ((4, 2.7764), (9, 2.2622), (30, 2.0423)):
        assert t_quantile(0.95, df) == pytest.approx(table, abs=1e-4)
    assert t_two_sided_mass(0.0, 5) == 0.0
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_t_quantile_matches_scipy():
    """scipy.stats.t.ppf as the reference (installed on this machine; not a dependency of agentenv)."""
    from scipy.stats import t

    for df in range(1, 41):
        for conf in (0.8, 0.9, 0.95, 0.99):
            assert t_quantile(conf, df) == pytest.approx(t.ppf((1 + conf) / 2, df), rel=1e-9)


def test_t_interval_by_hand():
    # mean 0.3, sample std 0.1, n 3: half = t(0.975, 2) * 0.1 / sqrt(3) = 4.302653 * 0.057735 = 0.248414
    iv = t_interval([0.2, 0.3, 0.4])
    assert iv.mean == pytest.approx(0.3)
    assert iv.half == pytest.approx(0.248414, abs=1e-6)
    assert (iv.low, iv.high) == pytest.approx((0.051586, 0.548414), abs=1e-6)
    assert iv.n == 3 and iv.excludes(0.0) and not iv.excludes(0.5)
    one = t_interval([0.4, float("nan")])
    assert one.n == 1 and one.mean == 0.4 and math.isnan(one.low) and not one.excludes(0.0)
    assert t_interval([]).n == 0


def test_paired_difference_is_taken_seed_by_seed():
    first = {0: 0.20, 1: 0.30, 2: 0.40}
    # +0.05, +0.06, +0.04 on the same seeds: mean 0.05, std 0.01, half 4.302653 * 0.01 / sqrt(3) = 0.024841
    other = {0: 0.25, 1: 0.36, 2: 0.44}
    assert paired_differences(first, other) == pytest.approx({0: 0.05, 1: 0.06, 2: 0.04})
    d = paired_interval(first, other)
    assert d.mean == pytest.approx(0.05)
    assert (d.low, d.high) == pytest.approx((0.025159, 0.074841), abs=1e-6)
    assert d.excludes(0.0)  # marked: the interval excludes 0
    # unpaired, the two intervals overlap (0.30 [0.05, 0.55] vs 0.35 [0.10, 0.60]): pairing removes the seed effect
    assert t_interval(first.values()).high > t_interval(other.values()).low
    # diffs +0.05, +0.08, +0.03: mean 0.053333, std 0.025166, half 0.062516 -> [-0.009183, 0.115849] holds 0
    d2 = paired_interval(first, {0: 0.25, 1: 0.38, 2: 0.43})
    assert (d2.low, d2.high) == pytest.approx((-0.009183, 0.115849), abs=1e-6)
    assert not d2.excludes(0.0)
    # every seed the same difference (accuracies in steps of 1/120, as in paper_table_toy's arpo_hard_once row):
    # a sample std of 0 (up to float rounding) is no interval, and nothing is marked
    d3 = paired_interval({0: 0.25, 1: 0.25, 2: 0.275}, {0: 28 / 120, 1: 28 / 120, 2: 31 / 120})
    assert d3.mean == pytest.approx(-2 / 120) and d3.degenerate and not d3.excludes(0.0)
    assert not d.degenerate and not t_interval([0.4]).degenerate
    # a seed one variant lacks (or a nan) is left out of the pairs
    assert paired_differences(first, {0: 0.3, 2: float("nan"), 7: 1.0}) == pytest.approx({0: 0.1})


def test_pass_at_k_and_kinds_over_seeds():
    # eval.json after a JSON round trip: the k are strings
    reports = [{"1": 0.2, "2": 0.3, "4": 0.5}, {"1": 0.4, "2": 0.5}, {"1": 0.3, "2": 0.4}]
    out = pass_at_k_over_seeds(reports)
    assert sorted(out) == [1, 2]  # k = 4 was not measured by every run
    assert out[1].mean == pytest.approx(0.3) and out[2].mean == pytest.approx(0.4)
    assert out[2].half == pytest.approx(0.248414, abs=1e-6)  # values 0.3, 0.4, 0.5: std 0.1, as above
    assert pass_at_k_over_seeds([]) == {}
    kinds = by_kind_over_seeds([{"arith": 0.5, "twohop": 0.1}, {"arith": 0.7}])
    assert list(kinds) == ["arith", "twohop"]
    assert kinds["arith"].mean == pytest.approx(0.6) and kinds["twohop"].n == 1


def test_eval_curve_reads_every_evaluation():
    recs = [{"step": 0, "eval/accuracy": 0.1}, {"step": 2, "rollout/reward": 0.3, "eval/accuracy": 0.2},
            {"step": 1, "rollout/reward": 0.1}, {"step": 4, "eval/accuracy": 0.4}]  # fmt: skip
    assert eval_curve(recs) == {0: 0.1, 2: 0.2, 4: 0.4}


def test_paired_t_power_is_the_noncentral_t_s():
    """Power of the two-sided paired t test at 0.05, checked against values of the noncentral t (scipy.stats.nct
    sf(c) + cdf(-c), c the t quantile): n 10, effect 1 sd -> 0.80310; n 300, 0.2 sd -> 0.93228; n 8, 0.9 -> 0.59129;
    no effect -> the test's level."""
    from agentenv.bench.stats import detectable_difference, paired_t_power

    assert paired_t_power(1.0, 10) == pytest.approx(0.803097, abs=1e-5)
    assert paired_t_power(0.2, 300) == pytest.approx(0.932280, abs=1e-5)
    assert paired_t_power(0.9, 8) == pytest.approx(0.591293, abs=1e-5)
    assert paired_t_power(0.0, 12) == pytest.approx(0.05, abs=1e-5)
    d = detectable_difference(2.0, 10)  # the difference with 80% power: power(d / sd) = 0.8
    assert paired_t_power(d / 2.0, 10) == pytest.approx(0.8, abs=1e-6) and d == pytest.approx(2 * 0.996001, abs=1e-5)
    assert detectable_difference(0.0, 5) == 0.0 and math.isnan(detectable_difference(1.0, 1))


def test_exact_mcnemar_counts_only_discordant_pairs():
    from agentenv.bench.stats import mcnemar_exact

    first = [1, 1, 1, 1, 0, 0, 1, 0]
    other = [0, 0, 0, 1, 0, 1, 1, 0]  # b = 3 only first, c = 1 only other: 2 * P(X <= 1), X ~ Bin(4, 1/2) = 0.625
    assert mcnemar_exact(first, other) == pytest.approx(0.625)
    assert mcnemar_exact([1] * 7, [0] * 7) == pytest.approx(2 / 128)
    assert mcnemar_exact([1, 0], [1, 0]) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact([1], [1, 0])


def test_holm_steps_down_and_keeps_order():
    from agentenv.bench.stats import holm

    # sorted 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> kept monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
