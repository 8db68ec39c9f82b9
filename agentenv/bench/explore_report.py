"""The exploration bench's metrics and report, computed from its per-trajectory records alone.

Per (budget, arm, task), from the `TrajRecord`s that ran (`task_stats`):

- attempts: trajectories that ran to an end of their own (an answer or not);
- pass@budget: any attempt correct (best-of-n with an oracle: it credits more
  attempts, so it is printed beside them);
- majority: the most frequent final answer over the attempts is correct (ties:
  the answer given first, in start order); no answer counts as wrong;
- top-scored: the answer the policy scores highest (the mean log-probability of
  its final turn) is correct;
- accuracy per trajectory: the share of attempts that are correct;
- pass@k at a matched k: k is the fewest attempts any arm made on that task
  and budget, the unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al.,
  2021), so every arm is read at the same number of answers;
- tool calls paid and refused, tokens generated and context tokens re-read,
  and for a tree the share of its probes that branched.

`compare` pairs two arms task by task: the mean difference with a t interval
over tasks, the exact McNemar p-value for the binary metrics (a paired t test
for the others), Holm's correction over every comparison one report makes, and
the smallest difference the comparison detects (paired t, noncentral t power
80%, from the observed spread of the differences). Single proportions get
Wilson intervals; means of per-task shares (accuracy per trajectory, pass@k) a
percentile bootstrap over tasks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentenv.bench.explore import INDEPENDENT, MAIN_TREE, MATCHED, TrajRecord
from agentenv.bench.stats import (
    Interval,
    crossed_bootstrap,
    detectable_difference,
    holm,
    mcnemar_exact,
    t_interval,
    t_two_sided_mass,
    wilson_interval,
)

BINARY = ("pass@budget", "majority", "top-scored")
CONTINUOUS = ("acc/traj", "pass@k")
COMPARISONS = (
    (MAIN_TREE, INDEPENDENT),
    (MAIN_TREE, MATCHED),
    (MAIN_TREE, "arpo_random"),
    ("arpo_minority", "arpo_random"),
    ("arpo_minority", MATCHED),
)
"""(arm, against) pairs a report makes when both arms are present: the tree against independent sampling,
against matched attempts (more answers, not a tree), against random branching (the entropy rule itself),
and the minority-threshold rule against random branching and matched attempts."""


@dataclass
class TaskStats:
    """One task at one budget in one arm (see the module docstring for each number)."""

    task_id: str
    kind: str
    attempts: int
    passed: bool
    majority: bool
    top_scored: bool
    acc_per_traj: float
    paid: int
    refused: int
    gen_tokens: int
    reread_tokens: int
    probes: int
    branched: int
    correct: int
    trajectories: int  # that ran, failed ones included (what the cap counts, with the episodes refused at start)
    pass_at_k: float = math.nan
    k: int = 0


def vote(records: Sequence[TrajRecord]) -> bool:
    """Majority vote over the attempts' answers is correct (ties: the answer given first)."""
    answers = [r for r in sorted(records, key=lambda r: r.order) if r.attempt and r.answer is not None]
    if not answers:
        return False
    counts = Counter(r.answer for r in answers)
    top = max(counts.values())
    winner = next(r.answer for r in answers if counts[r.answer] == top)
    return any(r.correct for r in answers if r.answer == winner)


def top_scored(records: Sequence[TrajRecord]) -> bool:
    """The answer whose final turn the policy scored highest is correct (ties: the first in start order)."""
    scored = [r for r in sorted(records, key=lambda r: r.order) if r.attempt and r.answer is not None and r.score is not None]
    if not scored:
        return False
    best = max(r.score for r in scored if r.score is not None)
    return next(r for r in scored if r.score == best).correct


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c correct: 1 - C(n - c, k) / C(n, k); 0 at k = 0."""
    if k <= 0 or n <= 0:
        return 0.0
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_stats(records: Iterable[TrajRecord]) -> dict[tuple[int, str, str], TaskStats]:
    """(budget, arm, task id) -> its `TaskStats`; pass@k at the fewest attempts any arm made on the task."""
    by: dict[tuple[int, str, str], list[TrajRecord]] = {}
    for r in records:
        by.setdefault((r.budget, r.arm, r.task_id), []).append(r)
    out: dict[tuple[int, str, str], TaskStats] = {}
    for key, rs in by.items():
        att = [r for r in rs if r.attempt]
        out[key] = TaskStats(
            task_id=key[2], kind=rs[0].kind, attempts=len(att), passed=any(r.correct for r in att),
            majority=vote(rs), top_scored=top_scored(rs),
            acc_per_traj=sum(r.correct for r in att) / len(att) if att else math.nan,
            paid=sum(r.paid for r in rs), refused=sum(r.refused for r in rs), gen_tokens=sum(r.gen_tokens for r in rs),
            reread_tokens=sum(r.reread_tokens for r in rs), probes=sum(len(r.probes) for r in rs),
            branched=sum(b for r in rs for _, b in r.probes), correct=sum(r.correct for r in att), trajectories=len(rs),
        )  # fmt: skip
    fewest: dict[tuple[int, str], int] = {}
    for (B, _, tid), s in out.items():
        fewest[B, tid] = min(fewest.get((B, tid), s.attempts), s.attempts)
    for (B, _, tid), s in out.items():
        s.k = fewest[B, tid]
        s.pass_at_k = pass_at_k(s.attempts, s.correct, s.k)
    return out


def metric(s: TaskStats, name: str) -> float:
    """One metric of a task's stats by its report name."""
    return {
        "pass@budget": float(s.passed), "majority": float(s.majority), "top-scored": float(s.top_scored),
        "acc/traj": s.acc_per_traj, "pass@k": s.pass_at_k, "attempts": float(s.attempts), "tool calls": float(s.paid),
        "refused": float(s.refused), "gen tokens": float(s.gen_tokens), "re-read tokens": float(s.reread_tokens),
    }[name]  # fmt: skip


@dataclass
class ArmRow:
    """One arm at one budget: each metric's mean over tasks with its interval."""

    budget: int
    arm: str
    tasks: int
    cells: dict[str, Interval]
    branch_share: float  # probes that branched / probes (nan without probes)
    mean_k: float
    most: int  # the most trajectories any task ran in this arm (against the cap, cap_per_call x B)


@dataclass
class Comparison:
    """`arm` minus `against`, paired by task, on one metric at one budget."""

    budget: int
    arm: str
    against: str
    metric: str
    diff: Interval
    p: float
    mde: float  # smallest true difference detected with 80% power at the 0.05 level
    p_holm: float = math.nan
    discordant: tuple[int, int] = (0, 0)  # binary metrics: tasks only `arm` solved, tasks only `against` solved
    tasks: list[str] = field(default_factory=list)


def arm_rows(stats: dict[tuple[int, str, str], TaskStats], arms: Sequence[str], confidence: float = 0.95) -> list[ArmRow]:
    """Per budget and arm: Wilson intervals for the binary metrics, a bootstrap over tasks for the means of per-task
    shares, t intervals over tasks for the counts."""
    rows = []
    for B in sorted({k[0] for k in stats}):
        ids = _common(stats, B, arms)
        for arm in arms:
            ss = [stats[B, arm, t] for t in ids]
            if not ss:
                continue
            cells = {m: wilson_interval(sum(metric(s, m) > 0 for s in ss), len(ss), confidence) for m in BINARY}
            for m in CONTINUOUS:  # means of per-task shares: a percentile bootstrap over tasks stays in [0, 1]
                vals = [metric(s, m) for s in ss if math.isfinite(metric(s, m))]
                cells[m] = crossed_bootstrap(np.array([vals]), confidence) if vals else t_interval([], confidence)
            for m in ("attempts", "tool calls", "refused", "gen tokens", "re-read tokens"):
                cells[m] = t_interval((metric(s, m) for s in ss), confidence)
            probes = sum(s.probes for s in ss)
            rows.append(ArmRow(B, arm, len(ss), cells, sum(s.branched for s in ss) / probes if probes else math.nan,
                               sum(s.k for s in ss) / len(ss), max(s.trajectories for s in ss)))  # fmt: skip
    return rows


def _common(stats: dict[tuple[int, str, str], TaskStats], B: int, arms: Sequence[str]) -> list[str]:
    """The tasks every present arm measured at budget B (the pairing)."""
    present = [a for a in arms if any(k[0] == B and k[1] == a for k in stats)]
    sets = [{k[2] for k in stats if k[0] == B and k[1] == a} for a in present]
    return sorted(set.intersection(*sets)) if sets else []


def compare(stats: dict[tuple[int, str, str], TaskStats], arms: Sequence[str], confidence: float = 0.95) -> list[Comparison]:
    """Every comparison of `COMPARISONS` whose arms are present, on every budget and on the five accuracy metrics,
    with Holm's correction over all of them."""
    out: list[Comparison] = []
    for B in sorted({k[0] for k in stats}):
        ids = _common(stats, B, arms)
        for arm, against in COMPARISONS:
            if arm not in arms or against not in arms or not ids:
                continue
            for m in (*BINARY, *CONTINUOUS):
                x = [metric(stats[B, arm, t], m) for t in ids]
                y = [metric(stats[B, against, t], m) for t in ids]
                pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
                d = [a - b for a, b in pairs]
                diff = t_interval(d, confidence)
                sd = _sd(d)
                if m in BINARY:
                    p = mcnemar_exact([a > 0 for a, _ in pairs], [b > 0 for _, b in pairs])
                    disc = (sum(a > b for a, b in pairs), sum(b > a for a, b in pairs))
                else:
                    p, disc = paired_t_p(d), (0, 0)
                out.append(Comparison(B, arm, against, m, diff, p, detectable_difference(sd, len(d), confidence),
                                      discordant=disc, tasks=ids))  # fmt: skip
    for c, adj in zip(out, holm([c.p for c in out])):
        c.p_holm = adj
    return out


def _sd(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def paired_t_p(d: Sequence[float]) -> float:
    """Two-sided p-value of the paired t test of mean(d) = 0 (1 when every difference is 0)."""
    sd = _sd(d)
    if not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 1.0 if all(x == 0 for x in d) else 0.0
    t = (sum(d) / len(d)) / (sd / math.sqrt(len(d)))
    return 1.0 - t_two_sided_mass(t, len(d) - 1)


# --------------------------------------------------------------------------- markdown
def _iv(iv: Interval, fmt: str = "{:.3f}", signed: bool = False) -> str:
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    f = "{:+.3f}" if signed else fmt
    if iv.n < 2 or not math.isfinite(iv.low):
        return f.format(iv.mean)
    lo, hi = (f"{iv.low:+.3f}", f"{iv.high:+.3f}") if signed else (fmt.format(iv.low), fmt.format(iv.high))
    return f"{f.format(iv.mean)} [{lo}, {hi}]"


ARM_COLUMNS = ("pass@budget", "majority", "top-scored", "acc/traj", "pass@k", "attempts", "tool calls", "refused",
               "gen tokens", "re-read tokens")  # fmt: skip


def arms_markdown(rows: Sequence[ArmRow]) -> str:
    """Each arm's means over tasks: Wilson 95% intervals for pass@budget, majority and top-scored, a bootstrap over
    tasks for acc/traj and pass@k, t for the counts."""
    head = "| B | arm | tasks | " + " | ".join(ARM_COLUMNS) + " | k of pass@k | probes branched | most trajectories |"
    lines = [head, "|" + "---:|" * 2 + "---:|" * (len(ARM_COLUMNS) + 4)]
    for r in rows:
        cells = [_iv(r.cells[c], "{:.1f}" if c in ARM_COLUMNS[5:] else "{:.3f}") for c in ARM_COLUMNS]
        share = "—" if not math.isfinite(r.branch_share) else f"{r.branch_share:.0%}"
        lines.append(f"| {r.budget} | {r.arm} | {r.tasks} | " + " | ".join(cells) + f" | {r.mean_k:.2f} | {share} | {r.most} |")
    return "\n".join(lines)


def comparisons_markdown(comps: Sequence[Comparison]) -> str:
    """Each comparison: the paired difference [95% t], its p (exact McNemar, or paired t), Holm's p, the MDE."""
    lines = [
        "| B | comparison | metric | difference [95% CI] | only one solved | p | Holm p | detectable at 80% power |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in comps:
        mark = " *" if c.p_holm < 0.05 else ""
        disc = f"{c.discordant[0]} / {c.discordant[1]}" if c.metric in BINARY else "—"
        lines.append(
            f"| {c.budget} | {c.arm} − {c.against} | {c.metric} | {_iv(c.diff, signed=True)}{mark} | {disc} | "
            f"{c.p:.3g} | {c.p_holm:.3g} | {c.mde:.3f} |"
        )
    return "\n".join(lines)


def summary_markdown(rows: Sequence[ArmRow], comps: Sequence[Comparison]) -> str:
    """The two tables the docs quote: each arm's accuracies and costs, and each comparison's differences on the
    four single-answer and best-of-n metrics (difference [95% CI], Holm-adjusted p) with the majority vote's
    detectable difference."""
    lines = [
        "| B | arm | pass@budget | majority | top-scored | acc/traj | pass@k (k) | attempts | tool calls paid / refused "
        "| tokens generated + re-read | probes branched |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = r.cells
        share = "—" if not math.isfinite(r.branch_share) else f"{r.branch_share:.0%}"
        lines.append(
            f"| {r.budget} | {r.arm} | {_iv(c['pass@budget'])} | {_iv(c['majority'])} | {_iv(c['top-scored'])} | "
            f"{_iv(c['acc/traj'])} | {c['pass@k'].mean:.3f} ({r.mean_k:.1f}) | {c['attempts'].mean:.1f} | "
            f"{c['tool calls'].mean:.1f} / {c['refused'].mean:.1f} | "
            f"{c['gen tokens'].mean:.0f} + {c['re-read tokens'].mean:.0f} | {share} |"
        )
    lines += ["", "| B | comparison | majority | top-scored | acc/traj | pass@k | pass@budget | majority detectable |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    by = {(c.budget, c.arm, c.against, c.metric): c for c in comps}
    for B, arm, against in dict.fromkeys((c.budget, c.arm, c.against) for c in comps):
        cells = []
        for m in ("majority", "top-scored", "acc/traj", "pass@k", "pass@budget"):
            comp = by[B, arm, against, m]
            cells.append(f"{_iv(comp.diff, signed=True)} (p {comp.p_holm:.2g})")
        lines.append(f"| {B} | {arm} − {against} | " + " | ".join(cells) + f" | {by[B, arm, against, 'majority'].mde:.3f} |")
    return "\n".join(lines)


def report(records: Sequence[TrajRecord], confidence: float = 0.95) -> tuple[str, list[ArmRow], list[Comparison]]:
    """The two tables of a run's records (arms in the order they first appear)."""
    arms = list(dict.fromkeys(r.arm for r in records))
    stats = task_stats(records)
    rows = arm_rows(stats, arms, confidence)
    comps = compare(stats, arms, confidence)
    text = (
        "Summary (pass@budget, majority, top-scored: Wilson 95% intervals; acc/traj: bootstrap over tasks; "
        "comparisons: paired by task, t interval, Holm-adjusted p of exact McNemar or paired t; detectable: at "
        "80% power):\n\n" + summary_markdown(rows, comps) + "\n\n"
        "Arms (mean over tasks; pass@budget, majority and top-scored: Wilson 95% intervals; acc/traj and pass@k: "
        "percentile bootstrap over tasks; the counts: t intervals over tasks):\n\n" + arms_markdown(rows) + "\n\n"
        "Comparisons, paired by task (* Holm-adjusted p < 0.05):\n\n" + comparisons_markdown(comps)
    )
    return text, rows, comps


def calibrate(records: Sequence[TrajRecord], alpha: float, beta: float, minority: float = 0.25) -> tuple[float, float, str]:
    """Thresholds of the control trees, from a pilot's `arpo` probes (the measured tasks under another seed: the
    probes' ΔH and decisions are read, never an answer; a pilot on other tasks can branch at another rate).

    Returns:
        (random τ, minority τ, a note saying how): the random tree's τ is the share of the entropy rule's probes
        that branched, so both branch as often; the minority arm's τ = α + β·q, q the ΔH quantile that only
        `minority` of the probes exceed, so the threshold rule branches on about that share.

    Raises:
        ValueError: No probe to calibrate on, or a threshold that is no probability.
    """
    probes = [p for r in records if r.arm == MAIN_TREE for p in r.probes]
    if not probes:
        raise ValueError("the pilot's arpo tree made no probe (no tool result to branch after)")
    share = sum(bool(b) for _, b in probes) / len(probes)
    q = float(np.quantile([float(dh) for dh, _ in probes], 1 - minority))
    tau = round(alpha + beta * q, 6)
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"the minority threshold α + β·q = {tau} is no probability")
    note = (f"calibrated on {len({r.task_id for r in records})} tasks under another seed: arpo branched at "
            f"{share:.1%} of {len(probes)} probes -> random tree τ {share:.4f}; ΔH q{100 * (1 - minority):.0f} "
            f"{q:+.5f} -> minority τ {tau}")  # fmt: skip
    return round(share, 4), tau, note


def plot_curves(rows: Sequence[ArmRow], path: str) -> None:
    """pass@budget and majority accuracy against tool calls paid and against tokens (generated + re-read), per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey="row")
    arms = list(dict.fromkeys(r.arm for r in rows))
    for i, m in enumerate(("pass@budget", "majority")):
        for j, x_of in enumerate(("tool calls", "tokens")):
            ax = axes[i][j]
            for arm in arms:
                rs = sorted((r for r in rows if r.arm == arm), key=lambda r: r.budget)
                xs = [r.cells["tool calls"].mean if x_of == "tool calls"
                      else r.cells["gen tokens"].mean + r.cells["re-read tokens"].mean for r in rs]  # fmt: skip
                ys = [r.cells[m].mean for r in rs]
                err = [[y - r.cells[m].low for y, r in zip(ys, rs)], [r.cells[m].high - y for y, r in zip(ys, rs)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
                for x, y, r in zip(xs, ys, rs):
                    ax.annotate(f"B={r.budget}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_xlabel("tool calls paid per task" if x_of == "tool calls" else "tokens per task (generated + re-read)")
            ax.set_ylabel(f"{m} (share of tasks)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
