"""Pure aggregation on hand-built inputs: spreads, curves, entropy by position after a tool result."""

from __future__ import annotations

import math

import pytest

from agentenv.bench.report import early_mean, pool_probes, variant_rows
from agentenv.bench.runner import Probe, RunResult
from agentenv.bench.stats import (
    PositionEntropy,
    curve,
    entropy_by_position,
    final_mean,
    mean_curve,
    spread,
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
