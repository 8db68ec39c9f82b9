"""Pure aggregation: spreads over seeds, metric curves, entropy by position after a tool result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from agentenv.types import Trajectory


@dataclass(frozen=True)
class Spread:
    """Mean and spread of one number over seeds.

    `std` is the sample standard deviation (ddof=1); 0 for a single seed.
    Values that are not finite are left out; with none left every field is nan.
    """

    mean: float
    std: float
    min: float
    max: float
    n: int


def spread(values: Iterable[float]) -> Spread:
    """Mean, sample std, min and max of the finite values."""
    xs = np.array([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)
    if xs.size == 0:
        nan = float("nan")
        return Spread(nan, nan, nan, nan, 0)
    std = float(xs.std(ddof=1)) if xs.size > 1 else 0.0
    return Spread(float(xs.mean()), std, float(xs.min()), float(xs.max()), int(xs.size))


def step_records(records: Sequence[Mapping[str, float]], key: str = "rollout/reward") -> list[Mapping[str, float]]:
    """The training-step records of a metrics.jsonl (eval-only records left out), by step."""
    return sorted((r for r in records if key in r), key=lambda r: r["step"])


def curve(records: Sequence[Mapping[str, float]], key: str) -> dict[int, float]:
    """step -> value of `key` over the training-step records that have it."""
    return {int(r["step"]): float(r[key]) for r in step_records(records) if key in r}


def final_mean(records: Sequence[Mapping[str, float]], key: str, last: int) -> float:
    """Mean of `key` over the last `last` training steps (nan if none has it)."""
    vals = [v for _, v in sorted(curve(records, key).items())][-last:] if last > 0 else []
    return float(np.mean(vals)) if vals else float("nan")


def mean_curve(curves: Sequence[Mapping[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, min and max over runs at every step that all runs logged."""
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    vals = np.array([[c[s] for s in steps] for c in curves], dtype=np.float64).reshape(len(curves), len(steps))
    return steps, vals.mean(0).tolist(), vals.min(0).tolist(), vals.max(0).tolist()


# --------------------------------------------------------------------------- entropy by position
@dataclass
class PositionEntropy:
    """Per-position entropy sums and counts, so runs pool by adding.

    `sums[i]` is the summed entropy (nats) of the tokens at position i of the
    segments measured, `counts[i]` how many segments reached position i.
    """

    sums: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    @classmethod
    def zeros(cls, positions: int) -> "PositionEntropy":
        return cls([0.0] * positions, [0] * positions)

    @property
    def mean(self) -> list[float]:
        """Mean entropy at each position (nan where no segment reached it)."""
        return [s / c if c else float("nan") for s, c in zip(self.sums, self.counts)]

    @property
    def segments(self) -> int:
        """How many segments were measured (all reach position 0)."""
        return self.counts[0] if self.counts else 0

    def __add__(self, other: "PositionEntropy") -> "PositionEntropy":
        if len(self.sums) != len(other.sums):
            raise ValueError(f"cannot pool {len(self.sums)} positions with {len(other.sums)}")
        return PositionEntropy(
            [a + b for a, b in zip(self.sums, other.sums)], [a + b for a, b in zip(self.counts, other.counts)]
        )

    def to_dict(self) -> dict[str, list]:
        return {"sums": list(self.sums), "counts": list(self.counts)}

    @classmethod
    def from_dict(cls, d: Mapping[str, list]) -> "PositionEntropy":
        return cls([float(x) for x in d["sums"]], [int(x) for x in d["counts"]])


def entropy_by_position(
    trajectories: Iterable[Trajectory], positions: int = 50, after: Literal["tool", "prompt"] = "tool"
) -> PositionEntropy:
    """Entropy at token positions 0..positions-1 of policy segments that follow `after`.

    `after="tool"`: every policy segment right after a tool result (the ARPO
    paper's pilot measurement: entropy rises in the first tokens after a tool
    call). `after="prompt"`: the first policy segment of each episode, as a
    reference. Failed trajectories and non-finite entropies are left out.
    """
    out = PositionEntropy.zeros(positions)
    for traj in trajectories:
        if traj.failed:
            continue
        for prev, seg in zip(traj.segments, traj.segments[1:]):
            if seg.source != "policy" or prev.source != after:
                continue
            for i, h in enumerate((seg.entropies or [])[:positions]):
                if math.isfinite(h):
                    out.sums[i] += float(h)
                    out.counts[i] += 1
    return out
