"""Pure aggregation: intervals over seeds, paired differences, pass@k, metric curves, entropy after a tool result.

Confidence intervals are Student t intervals over seeds: with n seeds,
mean ± t_{(1+c)/2, n-1} · s / √n (s the sample std). The t quantile is
computed here (A&S 26.7.3/26.7.4, exact for integer degrees of freedom), so
the statistics need no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

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


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its confidence interval.

    `low`/`high` are nan when fewer than 2 finite values exist (no interval).
    """

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    @property
    def half(self) -> float:
        """Half-width of the interval (nan without one)."""
        return (self.high - self.low) / 2

    @property
    def degenerate(self) -> bool:
        """Zero width: every seed gave the same value. Accuracies come in steps of 1 / episodes, so a few seeds
        can agree by chance; their sample std of 0 says nothing about the spread, and no t interval is made."""
        return self.n >= 2 and math.isclose(self.high, self.low, rel_tol=1e-9, abs_tol=1e-12)  # float rounding

    def excludes(self, value: float = 0.0) -> bool:
        """The interval exists, has a width, and `value` lies outside it (a difference 'significant' at
        1 - confidence). A degenerate interval excludes nothing."""
        return self.n >= 2 and not self.degenerate and (self.low > value or self.high < value)


def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` (integer >= 1) degrees of freedom.

    Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df), with
    θ = atan(t / √df): a finite series in cos²θ, exact for integer df.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/π)(θ + sinθ cosθ (1 + 2/3 cos² + 2·4/(3·5) cos⁴ + ... up to cos^(df-3)))
        total, term = (1.0, 1.0) if df > 1 else (0.0, 0.0)
        for j in range(2, df - 1, 2):
            term *= c2 * j / (j + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    total, term = 1.0, 1.0  # even: sinθ (1 + 1/2 cos² + 1·3/(2·4) cos⁴ + ... up to cos^(df-2))
    for j in range(1, df - 2, 2):
        term *= c2 * j / (j + 1)
        total += term
    return math.sin(theta) * total


def t_quantile(confidence: float, df: int) -> float:
    """The t such that P(|T| <= t) = `confidence` (0.95, df 2 -> 4.3027), by bisection on θ."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    lo, hi = 0.0, math.pi / 2  # θ; the mass rises monotonically from 0 to 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_mass(math.sqrt(df) * math.tan(mid), df) < confidence:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def t_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean of the finite values with its Student t interval (df = n - 1)."""
    xs = np.array([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)
    nan = float("nan")
    if xs.size == 0:
        return Interval(nan, nan, nan, 0, confidence)
    mean = float(xs.mean())
    if xs.size < 2:
        return Interval(mean, nan, nan, 1, confidence)
    half = t_quantile(confidence, xs.size - 1) * float(xs.std(ddof=1)) / math.sqrt(xs.size)
    return Interval(mean, mean - half, mean + half, int(xs.size), confidence)


def chi2_grid(df: int, points: int = 4001) -> tuple[np.ndarray, np.ndarray]:
    """Nodes v and trapezoid weights w with sum(w · f(v)) ≈ E[f(V)], V ~ χ²(df) (the bulk and both tails)."""
    hi = df + 12.0 * math.sqrt(2.0 * df) + 40.0
    v = np.linspace(1e-12, hi, points)
    logpdf = (df / 2 - 1) * np.log(v) - v / 2 - (df / 2) * math.log(2.0) - math.lgamma(df / 2)
    w = np.exp(logpdf) * (v[1] - v[0])
    w[0] /= 2
    w[-1] /= 2
    return v, w / w.sum()  # renormalized: the truncated mass (< 1e-9) and the grid's error go to the nodes


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def paired_t_power(effect: float, n: int, confidence: float = 0.95) -> float:
    """Power of the two-sided paired t test at level 1 - `confidence`: P(|T'| > t_crit).

    T' is noncentral t with n - 1 degrees of freedom and noncentrality
    `effect` · √n, `effect` the true mean difference over the differences' sd.
    Computed exactly (up to quadrature: within 1e-5 of scipy's `nct`): T' = (Z + δ) / √(V / df), so
    P(|T'| > c) = E_V[Φ(-c√(V/df) - δ) + Φ(-c√(V/df) + δ)], integrated over V ~ χ²(df).
    """
    if n < 2:
        return float("nan")
    df = n - 1
    c = t_quantile(confidence, df)
    delta = abs(effect) * math.sqrt(n)
    v, w = chi2_grid(df)
    s = c * np.sqrt(v / df)
    return float(np.sum(w * (_normal_cdf(-s - delta) + _normal_cdf(-s + delta))))


def detectable_difference(sd: float, n: int, confidence: float = 0.95, power: float = 0.8) -> float:
    """The smallest true paired difference that `n` pairs detect with probability `power`.

    A two-sided paired t test over n pairs whose differences spread with
    standard deviation `sd`, its power from the noncentral t
    (`paired_t_power`), solved for the difference by bisection. nan below 2
    pairs; 0 when `sd` is 0.
    """
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if sd == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while paired_t_power(hi, n, confidence) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if paired_t_power(mid, n, confidence) < power else (lo, mid)
    return hi * sd


def mcnemar_exact(first: Sequence[bool], other: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value of paired binary outcomes (one pair per task).

    Only the discordant pairs count: b tasks where only `first` succeeded, c
    where only `other` did; under the null each is b-or-c with probability
    1/2, so p = min(1, 2 · P(X <= min(b, c))), X ~ Binomial(b + c, 1/2).
    """
    if len(first) != len(other):
        raise ValueError(f"paired outcomes need equal lengths, got {len(first)} and {len(other)}")
    b = sum(bool(x) and not bool(y) for x, y in zip(first, other))
    c = sum(bool(y) and not bool(x) for x, y in zip(first, other))
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the comparisons one report makes), in order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def crossed_bootstrap(diffs: np.ndarray, confidence: float = 0.95, reps: int = 4000, seed: int = 0) -> Interval:
    """Mean of a seeds x tasks matrix of paired differences with a crossed percentile bootstrap interval.

    Every replicate draws the seeds and the tasks with replacement, independently (rows and columns: a
    run's seed and the held-out task are both sampled units), and takes the mean of the resampled matrix;
    the interval is the replicates' central `confidence` share. Seeded: the same input gives the same interval.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 2 or d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"need a finite seeds x tasks matrix, got shape {d.shape}")
    s, t = d.shape
    rng = np.random.default_rng(seed)
    means = np.empty(reps)
    for i in range(reps):
        means[i] = d[rng.integers(s, size=s)][:, rng.integers(t, size=t)].mean()
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(float(d.mean()), float(lo), float(hi), int(s * t), confidence)


def binomial_error(p: float, n: int) -> float:
    """Standard error of a share p measured on n independent episodes: √(p(1-p)/n) (nan without any)."""
    return math.sqrt(p * (1 - p) / n) if n > 0 and math.isfinite(p) else float("nan")


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """A share of successes among `n` independent trials with its Wilson score interval.

    (p + z²/2n ± z·√(p(1-p)/n + z²/4n²)) / (1 + z²/n), z the normal quantile; it
    stays inside [0, 1] and is sound at 0 or n successes, where the Wald interval is not.
    """
    if n <= 0:
        nan = float("nan")
        return Interval(nan, nan, nan, 0, confidence)
    z = float(np.sqrt(2.0)) * _erfinv(confidence)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n, confidence)


def _erfinv(y: float) -> float:
    """erf^-1(y) by bisection on math.erf (to 1e-12: the statistics need no scipy)."""
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def paired_differences(first: Mapping[int, float], other: Mapping[int, float]) -> dict[int, float]:
    """seed -> other[seed] - first[seed], over the seeds both have with finite values."""
    return {
        s: float(other[s]) - float(first[s])
        for s in sorted(set(first) & set(other))
        if math.isfinite(float(first[s])) and math.isfinite(float(other[s]))
    }


def paired_interval(first: Mapping[int, float], other: Mapping[int, float], confidence: float = 0.95) -> Interval:
    """Mean of the per-seed differences `other - first` with its t interval (paired: seed by seed)."""
    return t_interval(paired_differences(first, other).values(), confidence)


def pass_at_k_over_seeds(reports: Sequence[Mapping[str | int, float]], confidence: float = 0.95) -> dict[int, Interval]:
    """k -> interval over seeds of each run's pass@k (its mean over tasks), for the k every run measured.

    `reports` are the runs' `eval.json["pass_at"]` mappings (JSON turns the k into strings).
    """
    if not reports:
        return {}
    ks = sorted(set.intersection(*({int(k) for k in r} for r in reports)))
    return {k: t_interval((float(r.get(k, r.get(str(k), math.nan))) for r in reports), confidence) for k in ks}


def by_kind_over_seeds(reports: Sequence[Mapping[str, float]], confidence: float = 0.95) -> dict[str, Interval]:
    """kind -> interval over seeds of the runs' per-kind accuracy (`eval.json["by_kind"]`), kinds in order."""
    kinds = sorted({k for r in reports for k in r})
    return {k: t_interval((r.get(k, math.nan) for r in reports), confidence) for k in kinds}


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


def eval_curve(records: Sequence[Mapping[str, float]], key: str = "eval/accuracy") -> dict[int, float]:
    """step -> held-out `key` over every evaluation a run logged (at the start, every `eval_every`, the end)."""
    return {int(r["step"]): float(r[key]) for r in sorted(records, key=lambda r: r["step"]) if key in r}


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
    def zeros(cls, positions: int) -> PositionEntropy:
        return cls([0.0] * positions, [0] * positions)

    @property
    def mean(self) -> list[float]:
        """Mean entropy at each position (nan where no segment reached it)."""
        return [s / c if c else float("nan") for s, c in zip(self.sums, self.counts)]

    @property
    def segments(self) -> int:
        """How many segments were measured (all reach position 0)."""
        return self.counts[0] if self.counts else 0

    def __add__(self, other: PositionEntropy) -> PositionEntropy:
        if len(self.sums) != len(other.sums):
            raise ValueError(f"cannot pool {len(self.sums)} positions with {len(other.sums)}")
        return PositionEntropy(
            [a + b for a, b in zip(self.sums, other.sums)], [a + b for a, b in zip(self.counts, other.counts)]
        )

    def to_dict(self) -> dict[str, list]:
        return {"sums": list(self.sums), "counts": list(self.counts)}

    @classmethod
    def from_dict(cls, d: Mapping[str, list]) -> PositionEntropy:
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
