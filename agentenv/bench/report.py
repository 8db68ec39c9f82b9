"""The benchmark's report: one row per variant (CSV and markdown), the pairing check, and the plots.

Held-out numbers are the trainer's final evaluation of each run; over seeds
they are a mean with its Student t interval, and each variant's difference
from the first variant is taken seed by seed (paired) with its own interval.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentenv.bench.results import Probe, RunResult, pool_probes
from agentenv.bench.stats import (
    Interval,
    PositionEntropy,
    Spread,
    binomial_error,
    by_kind_over_seeds,
    crossed_bootstrap,
    curve,
    detectable_difference,
    final_mean,
    paired_differences,
    paired_interval,
    pass_at_k_over_seeds,
    spread,
    t_interval,
)

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.bench.config import BenchConfig

# (column stem, metrics.jsonl key) of the rollout metrics averaged over the final steps
ROLLOUT_METRICS = (
    ("reward", "rollout/reward"),
    ("accuracy_train", "rollout/accuracy"),
    ("tool_calls_per_traj", "rollout/tool_calls_per_traj"),
    ("tool_results_per_group", "rollout/tool_results_per_group"),
    ("gen_tokens_per_group", "rollout/gen_tokens_per_group"),
    ("entropy", "rollout/entropy"),
    ("step_s", "time/step_s"),
    ("rollout_s", "time/rollout_s"),
    ("old_logprobs_s", "time/old_logprobs_s"),
    ("update_s", "time/update_s"),
    ("push_s", "time/push_s"),
    # what ARPO's sampler did (`agentenv.algorithms.arpo.metrics`); absent (n/a) for other algorithms
    ("arpo_branches_per_tree", "arpo/branches_per_tree"),
    ("arpo_branch_points_per_traj", "arpo/branch_points_per_traj"),
    ("arpo_delta_h_after_tool", "arpo/delta_h_after_tool"),
    ("arpo_delta_h_at_branch", "arpo/delta_h_at_branch"),
    ("arpo_branch_share_of_tools", "arpo/branch_share_of_tools"),
    ("arpo_budget_out", "arpo/budget_out"),
    # GiGPO's anchor groups and step-level advantage (`agentenv.algorithms.gigpo.algorithm.step_metrics`)
    ("gigpo_steps", "train/gigpo/steps"),
    ("gigpo_anchor_share", "train/gigpo/anchor_share"),
    ("gigpo_step_adv_std", "train/gigpo/step_adv_std"),
    ("gigpo_step_adv_abs_mean", "train/gigpo/step_adv_abs_mean"),
)

# positions after a tool result that the table's entropy column averages
EARLY_POSITIONS = 10


@dataclass
class VariantRow:
    """One variant's numbers over seeds.

    Attributes:
        variant, algorithm: Which variant.
        seeds: The seeds it ran.
        heldout_accuracy: Final held-out accuracy (eval.json) over seeds.
        accuracy_ci: The same as a mean with its t interval.
        diff_vs_first: Paired difference from the first variant's accuracy
            (seed by seed) with its t interval; None for the first variant.
        pass_at: k -> pass@k over seeds (each run's mean over tasks).
        by_kind: task kind -> accuracy over seeds.
        heldout_tool_calls: Tool calls per held-out task over seeds.
        rollout: Column stem -> spread over seeds of each seed's mean over the
            last `final_steps` training steps (see `ROLLOUT_METRICS`).
        wall_s: Wall time per run (trainer build, training, evaluations,
            probe; the first run also pays for imports and index builds).
        train_s: Training time per run: the sum of the steps' `time/step_s`
            (rollout and update; the fair cost comparison).
        entropy_after_tool: Pooled probe entropy over the first
            `EARLY_POSITIONS` tokens after a tool result (nan without tool calls).
        entropy_first_turn: The same over the first tokens of the first turn.
    """

    variant: str
    algorithm: str
    seeds: list[int]
    heldout_accuracy: Spread
    accuracy_ci: Interval
    diff_vs_first: Interval | None
    pass_at: dict[int, Interval]
    by_kind: dict[str, Interval]
    heldout_tool_calls: Spread
    rollout: dict[str, Spread]
    wall_s: Spread
    train_s: Spread
    entropy_after_tool: float
    entropy_first_turn: float


def early_mean(pe: PositionEntropy | None, k: int = EARLY_POSITIONS) -> float:
    """Token-weighted mean entropy over positions 0..k-1 (nan when empty)."""
    if pe is None:
        return float("nan")
    n = sum(pe.counts[:k])
    return sum(pe.sums[:k]) / n if n else float("nan")


def _accuracy_by_seed(runs: Sequence[RunResult]) -> dict[int, float]:
    return {r.seed: float(r.eval.get("accuracy", math.nan)) for r in runs}


def variant_rows(runs: Sequence[RunResult], last: int, confidence: float = 0.95) -> list[VariantRow]:
    """Aggregate runs into one row per variant (in the order variants first appear)."""
    order: list[str] = []
    by: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.variant not in by:
            order.append(r.variant)
            by[r.variant] = []
        by[r.variant].append(r)
    rows = []
    first = _accuracy_by_seed(by[order[0]]) if order else {}
    for i, name in enumerate(order):
        rs = by[name]
        acc = _accuracy_by_seed(rs)
        rows.append(
            VariantRow(
                variant=name,
                algorithm=rs[0].algorithm,
                seeds=[r.seed for r in rs],
                heldout_accuracy=spread(acc.values()),
                accuracy_ci=t_interval(acc.values(), confidence),
                diff_vs_first=paired_interval(first, acc, confidence) if i else None,
                pass_at=pass_at_k_over_seeds([r.eval.get("pass_at", {}) for r in rs], confidence),
                by_kind=by_kind_over_seeds([r.eval.get("by_kind", {}) for r in rs], confidence),
                heldout_tool_calls=spread(r.eval.get("tool_calls", math.nan) for r in rs),
                rollout={stem: spread(final_mean(r.records, key, last) for r in rs) for stem, key in ROLLOUT_METRICS},
                wall_s=spread(r.wall_s + r.probe_s for r in rs),
                train_s=spread(sum(curve(r.records, "time/step_s").values()) for r in rs),
                entropy_after_tool=early_mean(pool_probes([r.probe for r in rs], "after_tool")),
                entropy_first_turn=early_mean(pool_probes([r.probe for r in rs], "after_prompt")),
            )
        )
    return rows


# --------------------------------------------------------------------------- CSV
def csv_header() -> list[str]:
    cols = ["variant", "algorithm", "n_seeds", "seeds"]
    cols += ["heldout_accuracy_mean", "heldout_accuracy_std", "heldout_accuracy_min", "heldout_accuracy_max"]
    cols += ["heldout_accuracy_ci_low", "heldout_accuracy_ci_high"]
    cols += ["diff_vs_first_mean", "diff_vs_first_ci_low", "diff_vs_first_ci_high", "diff_vs_first_excludes_0"]
    cols += ["pass_at", "by_kind"]
    cols += ["heldout_tool_calls_mean", "heldout_tool_calls_std"]
    for stem, _ in ROLLOUT_METRICS:
        cols += [f"{stem}_mean", f"{stem}_std"]
    cols += ["train_s_mean", "train_s_std", "wall_s_mean", "wall_s_std"]
    cols += ["entropy_after_tool_0_9", "entropy_first_turn_0_9"]
    return cols


def csv_row(row: VariantRow) -> list[Any]:
    a = row.heldout_accuracy
    vals: list[Any] = [row.variant, row.algorithm, len(row.seeds), " ".join(map(str, row.seeds))]
    vals += [a.mean, a.std, a.min, a.max, row.accuracy_ci.low, row.accuracy_ci.high]
    d = row.diff_vs_first
    vals += [d.mean, d.low, d.high, int(d.excludes(0.0))] if d is not None else ["", "", "", ""]
    vals += [
        " ".join(f"{k}:{v.mean:.4f}" for k, v in row.pass_at.items()),
        " ".join(f"{k}:{v.mean:.4f}" for k, v in row.by_kind.items()),
    ]
    vals += [row.heldout_tool_calls.mean, row.heldout_tool_calls.std]
    for stem, _ in ROLLOUT_METRICS:
        vals += [row.rollout[stem].mean, row.rollout[stem].std]
    vals += [row.train_s.mean, row.train_s.std, row.wall_s.mean, row.wall_s.std]
    vals += [row.entropy_after_tool, row.entropy_first_turn]
    return vals


def write_csv(rows: Sequence[VariantRow], path: Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(csv_header())
        for row in rows:
            w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in csv_row(row)])


# --------------------------------------------------------------------------- markdown
def _pm(s: Spread, fmt: str = "{:.3f}") -> str:
    if s.n == 0:
        return "n/a"
    return fmt.format(s.mean) + (f" ± {fmt.format(s.std)}" if s.n > 1 else "")


def fmt_interval(iv: Interval | None, fmt: str = "{:.3f}", signed: bool = False) -> str:
    """`0.250 [0.190, 0.310]`; `+0.040 [0.010, 0.070] *` when a signed difference's interval excludes 0."""
    if iv is None:
        return "—"
    if iv.n == 0:
        return "n/a"
    f = fmt.replace("{:", "{:+") if signed else fmt
    text = f.format(iv.mean)
    if iv.degenerate:
        text += f" [all {iv.n} seeds equal]"
    elif iv.n >= 2:
        text += f" [{fmt.format(iv.low)}, {fmt.format(iv.high)}]"
    if signed and iv.excludes(0.0):
        text += " *"
    return text


def _ratio(x: float, ref: float) -> str:
    return f" ({x / ref:.2f}x)" if ref and math.isfinite(x) and math.isfinite(ref) else ""


def _mean_cell(r: VariantRow, stem: str, fmt: str) -> str:
    s = r.rollout[stem]
    return fmt.format(s.mean) if s.n else "n/a"


def tree_cell(r: VariantRow) -> str:
    """What ARPO's trees did, in one cell: branches per tree, branch points per trajectory, mean ΔH after a
    tool result / at the branch points, the share of tool results spent on branches, trees whose budget ran out."""
    if r.rollout["arpo_branches_per_tree"].n == 0:
        return "—"

    def v(stem: str, fmt: str) -> str:
        return _mean_cell(r, stem, fmt)

    return (
        f"{v('arpo_branches_per_tree', '{:.1f}')} br/tree, {v('arpo_branch_points_per_traj', '{:.2f}')} bp/traj, "
        f"ΔH {v('arpo_delta_h_after_tool', '{:+.3f}')} / {v('arpo_delta_h_at_branch', '{:+.3f}')}, "
        f"{v('arpo_branch_share_of_tools', '{:.0%}')} of calls, out {v('arpo_budget_out', '{:.0%}')}"
    )


def anchor_cell(r: VariantRow) -> str:
    """What GiGPO's anchor groups did, in one cell: the share of steps in an anchor group of size > 1, and the
    step-level advantage's std and mean |A^S| over steps."""
    if r.rollout["gigpo_anchor_share"].n == 0:
        return "—"
    return (
        f"anchors {_mean_cell(r, 'gigpo_anchor_share', '{:.0%}')}, "
        f"A^S std {_mean_cell(r, 'gigpo_step_adv_std', '{:.2f}')}, "
        f"mean \\|A^S\\| {_mean_cell(r, 'gigpo_step_adv_abs_mean', '{:.2f}')}"
    )


def markdown_table(rows: Sequence[VariantRow], last: int) -> str:
    """The main table: held-out accuracy with intervals, the paired difference, pass@k, costs."""
    first = rows[0].variant if rows else ""
    k_max = max((k for r in rows for k in r.pass_at), default=1)
    head = [
        "variant",
        "algorithm",
        "seeds",
        "held-out acc [95% CI]",
        f"Δ acc vs {first} [95% CI]",
        f"pass@{k_max}",
        f"reward (last {last})",
        "tool calls/traj",
        "tool results/group (vs first)",
        "ARPO tree",
        "GiGPO anchors",
        "gen tokens/group",
        "H after tool (0-9)",
        "wall min/run",
        "wall min (all seeds)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
    ref_calls = rows[0].rollout["tool_results_per_group"].mean if rows else math.nan
    for r in rows:
        h = "n/a" if math.isnan(r.entropy_after_tool) else f"{r.entropy_after_tool:.3f}"
        calls = r.rollout["tool_results_per_group"]
        cells = [
            r.variant,
            r.algorithm,
            str(len(r.seeds)),
            fmt_interval(r.accuracy_ci),
            fmt_interval(r.diff_vs_first, signed=True),
            fmt_interval(r.pass_at.get(k_max)),
            _pm(r.rollout["reward"]),
            _pm(r.rollout["tool_calls_per_traj"], "{:.2f}"),
            _pm(calls, "{:.1f}") + _ratio(calls.mean, ref_calls),
            tree_cell(r),
            anchor_cell(r),
            _pm(r.rollout["gen_tokens_per_group"], "{:.0f}"),
            h,
            _pm(Spread(r.wall_s.mean / 60, r.wall_s.std / 60, r.wall_s.min / 60, r.wall_s.max / 60, r.wall_s.n), "{:.1f}"),
            f"{r.wall_s.mean * r.wall_s.n / 60:.1f}" if r.wall_s.n else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kind_table(rows: Sequence[VariantRow]) -> str:
    """Held-out accuracy per task kind (mean [95% CI] over seeds) and pass@k for every k measured."""
    kinds = sorted({k for r in rows for k in r.by_kind})
    ks = sorted({k for r in rows for k in r.pass_at})
    head = ["variant", *kinds, *(f"pass@{k}" for k in ks)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "|".join(["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r.variant, *(fmt_interval(r.by_kind.get(k)) for k in kinds), *(fmt_interval(r.pass_at.get(k)) for k in ks)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing_table(rows: Sequence[VariantRow], last: int) -> str:
    """A training step itemized (mean ± std over seeds of each run's mean over the last steps)."""
    head = ["variant", "train s/run", "step s", "rollout s/step", "old-lp s/step", "update s/step", "push s/step"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "|".join(["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r.variant, _pm(r.train_s, "{:.0f}")]
        cells += [_pm(r.rollout[k], "{:.2f}") for k in ("step_s", "rollout_s", "old_logprobs_s", "update_s", "push_s")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def resolution(bench: BenchConfig, runs: Sequence[RunResult], rows: Sequence[VariantRow]) -> list[str]:
    """What this design can resolve: one run's binomial error, the seed-to-seed spread of the paired
    differences, the smallest difference it detects, and the positive control's verdict."""
    if not rows:
        return []
    conf = bench.confidence
    first = rows[0].variant
    by: dict[str, dict[int, float]] = {}
    for r in runs:
        by.setdefault(r.variant, {})[r.seed] = float(r.eval.get("accuracy", math.nan))
    n_tasks = max((int(r.eval.get("n_tasks", 0)) for r in runs), default=0)
    acc = spread(a for v in by.values() for a in v.values())
    err = binomial_error(acc.mean, n_tasks)
    lines = [
        f"Resolution. One run's held-out accuracy has a binomial standard error of ±{100 * err:.1f} points "
        f"(accuracy {acc.mean:.2f}, {n_tasks} tasks; more samples per task narrow it less than more tasks)."
    ]
    # the seed-to-seed spread of paired differences, pooled over the variants that are not the control
    variances, n_seeds = [], 0
    for name, accs in by.items():
        if name in (first, bench.control):
            continue
        diffs = list(paired_differences(by[first], accs).values())
        if len(diffs) >= 2:
            variances.append(float(spread(diffs).std) ** 2)
            n_seeds = max(n_seeds, len(diffs))
    if variances:
        sd = math.sqrt(sum(variances) / len(variances))
        mde = detectable_difference(sd, n_seeds, conf)
        lines.append(
            f"Seed-to-seed spread of a paired difference (sd over seeds, pooled over {len(variances)} variant(s)): "
            f"{100 * sd:.1f} points; with {n_seeds} seeds the smallest difference from {first} this design detects "
            f"(paired t test at {1 - conf:.2f}, 80% power) is {100 * mde:.1f} points."
        )
    if bench.control:
        row = next((r for r in rows if r.variant == bench.control), None)
        d = row.diff_vs_first if row is not None else None
        if d is None or d.n < 2:
            lines.append(f"Positive control {bench.control}: no paired difference (fewer than 2 seeds); nothing resolved.")
        elif d.excludes(0.0) and d.high < 0:  # a degenerate interval (every seed equal) excludes nothing
            lines.append(
                f"Positive control {bench.control}: {fmt_interval(d, signed=True)} against {first}, below 0 outside "
                f"the {conf:.0%} interval, as it must be: the bench resolves a difference of this size."
            )
        else:
            lines.append(
                f"Positive control {bench.control}: {fmt_interval(d, signed=True)} against {first}; its interval "
                f"does not lie below 0, so THIS BENCH RESOLVES NOTHING: no difference in the table can be told "
                "from noise (more seeds, more held-out tasks or more steps are needed)."
            )
    return lines


def pairing_check(runs: Sequence[RunResult]) -> list[str]:
    """Check that the runs of one seed were paired; returns the problems found (empty: paired).

    For each seed, every variant must have trained on the same task batches
    (`batches.jsonl`, step by step), been evaluated on the same number of
    held-out tasks, and with the same evaluation seed as the first variant.
    An algorithm that draws extra tasks (dynamic sampling) shows here as a
    batch that differs.
    """
    problems: list[str] = []
    by_seed: dict[int, list[RunResult]] = {}
    for r in runs:
        by_seed.setdefault(r.seed, []).append(r)
    for seed, rs in sorted(by_seed.items()):
        ref = rs[0]
        ref_batches = _batches(ref)
        for r in rs[1:]:
            b = _batches(r)
            diff = [s for s in sorted(set(ref_batches) | set(b)) if ref_batches.get(s) != b.get(s)]
            if diff:
                problems.append(
                    f"seed {seed}: {r.variant} trained on other tasks than {ref.variant} at steps "
                    f"{', '.join(map(str, diff[:5]))}{' ...' if len(diff) > 5 else ''}"
                )
            if r.eval.get("n_tasks") != ref.eval.get("n_tasks"):
                problems.append(f"seed {seed}: {r.variant} was evaluated on {r.eval.get('n_tasks')} held-out tasks, "
                                f"{ref.variant} on {ref.eval.get('n_tasks')}")  # fmt: skip
            if _eval_seed(r) != _eval_seed(ref):
                problems.append(f"seed {seed}: {r.variant} evaluated with seed {_eval_seed(r)}, "
                                f"{ref.variant} with {_eval_seed(ref)}")  # fmt: skip
    return problems


def _batches(run: RunResult) -> dict[int, list[str]]:
    path = Path(run.output_dir) / "batches.jsonl"
    if not path.exists():
        return {}
    return {int(d["step"]): list(d["tasks"]) for d in map(json.loads, path.read_text().splitlines()) if d}


def _trainer_section(run: RunResult) -> dict[str, Any]:
    """The run's `trainer` config section, from its config.json ({} without one)."""
    path = Path(run.output_dir) / "config.json"
    return json.loads(path.read_text()).get("trainer", {}) if path.exists() else {}


def _eval_seed(run: RunResult) -> Any:
    t = _trainer_section(run)
    return t.get("seed") if t.get("eval_seed") is None else t.get("eval_seed")


def _per_task(run: RunResult, which: str) -> dict[str, float]:
    """task id -> the share of its samples that were correct, from `eval.json`'s per-task records
    (`which`: "sampled", the trainer's evaluation, or "greedy", its greedy one); {} without records."""
    rep = run.eval if which == "sampled" else run.eval.get("greedy", {})
    return {str(t["task"]): sum(t["correct"]) / len(t["correct"]) for t in rep.get("per_task", []) if t["correct"]}


def evaluation_table(runs: Sequence[RunResult], confidence: float = 0.95) -> str:
    """Each variant's final evaluation, sampled and greedy, from the per-task records: accuracy over seeds
    [t], the difference from the first variant with a crossed task x seed bootstrap interval, and tool calls
    per answer [t over seeds]. Empty when the runs kept no per-task records."""
    order = list(dict.fromkeys(r.variant for r in runs))
    if not order or not any(_per_task(r, "sampled") for r in runs):
        return ""
    by = {(r.variant, r.seed): r for r in runs}
    seeds = sorted({r.seed for r in runs})
    temp = _trainer_section(runs[0]).get("eval_temperature", "?")
    lines = [
        f"| variant | evaluation | accuracy [{confidence:.0%} t over seeds] | Δ vs {order[0]} "
        f"[{confidence:.0%} task x seed bootstrap] | tool calls per answer [t over seeds] |",
        "|---|---|---:|---:|---:|",
    ]
    for which, label in (("sampled", f"sampled at T={temp}, eval_seed fixed"), ("greedy", "greedy (T=0)")):
        for name in order:
            mine = {sd: _per_task(by[name, sd], which) for sd in seeds if (name, sd) in by}
            mine = {sd: m for sd, m in mine.items() if m}
            if not mine:
                continue
            acc = t_interval((sum(m.values()) / len(m) for m in mine.values()), confidence)
            rep = [by[name, sd].eval if which == "sampled" else by[name, sd].eval.get("greedy", {}) for sd in mine]
            calls = t_interval((float(r.get("tool_calls", math.nan)) for r in rep), confidence)  # per sample: per answer
            diff = "—"
            if name != order[0]:
                ref = {sd: _per_task(by[order[0], sd], which) for sd in mine if (order[0], sd) in by}
                both = [sd for sd in mine if ref.get(sd)]
                tasks = sorted(set.intersection(*(set(mine[sd]) & set(ref[sd]) for sd in both))) if both else []
                if tasks:
                    d = np.array([[mine[sd][t] - ref[sd][t] for t in tasks] for sd in both])
                    iv = crossed_bootstrap(d, confidence)
                    shown = f"{iv.mean:+.3f} [every difference equal]" if iv.degenerate else fmt_interval(iv, signed=True)
                    diff = f"{shown} ({len(both)} seeds x {len(tasks)} tasks)"
            lines.append(f"| {name} | {label} | {fmt_interval(acc)} | {diff} | {fmt_interval(calls, '{:.2f}')} |")
    return "\n".join(lines)


def markdown_report(
    bench: BenchConfig, runs: Sequence[RunResult], rows: Sequence[VariantRow], last: int, plots: dict[str, Path]
) -> str:
    """Title, the shared budget, the pairing check, how to read the columns, the tables, the plots."""
    tc = _trainer_summary(runs)
    conf = f"{bench.confidence:.0%}"
    problems = pairing_check(runs)
    steps = len({s for r in runs[:1] for s in _batches(r)})
    paired = (
        f"Paired: for each seed every variant trained on the same task batches ({steps} steps, checked in "
        "batches.jsonl), with the same sampling seeds, and was evaluated on the same held-out tasks with the same "
        "evaluation seed."
        if not problems
        else "Pairing problems (differences are less precise than paired ones): " + "; ".join(problems) + "."
    )
    smoke = " Smoke run: fewer than 3 seeds, the intervals are missing or very wide." if bench.smoke else ""
    lines = [
        f"# {bench.name}",
        "",
        f"{len(rows)} variants × {len(bench.seeds)} seeds ({', '.join(map(str, bench.seeds))}); {tc}.{smoke}",
        paired,
        "",
        f"Held-out accuracy: the trainer's final evaluation; mean over seeds [{conf} Student t interval]. "
        f"Δ: each seed's accuracy minus {rows[0].variant if rows else 'the first variant'}'s on the same seed, "
        f"mean [{conf} t interval over the per-seed differences]; * marks an interval that excludes 0 "
        "(`all n seeds equal`: every seed gave the same value, no interval and no *). "
        f"Rollout columns: mean ± std over seeds of the last {last} training steps. "
        "tool results/group: the tool results the env returned per task (a tree's shared prefix counted once: "
        "the tool-call budget the ARPO paper compares; answers to malformed calls included), and its ratio to "
        "the first variant; tool calls/traj: well-formed calls per trajectory, shared prefixes counted in each. "
        "ARPO tree (means over the same steps and seeds): branches per tree, branch points per trajectory, "
        "ΔH = (H_t - H_initial) / scale over every probed tool result / at the branch points chosen, the share of "
        "the tree's tool results its branches paid for, and the share of trees whose branch slots ran out. "
        "GiGPO anchors (means over the same steps and seeds): the share of policy turns (GiGPO's steps) in an "
        "anchor group of size > 1, and the std and mean |A^S| of the step-level advantage over a training step's turns. "
        f"H after tool: mean entropy (nats) of the first {EARLY_POSITIONS} tokens after a tool result, "
        f"from {bench.probe.samples} rollouts × {bench.probe.tasks} held-out tasks of each final policy "
        f"({'seeds ' + ', '.join(map(str, bench.probe.seeds)) if bench.probe.seeds else 'every seed'}, pooled). "
        "wall: training, evaluations and probe of a run.",
        "",
        markdown_table(rows, last),
        "",
        *(line for text in resolution(bench, runs, rows) for line in (text, "")),
        f"Held-out accuracy by task kind and pass@k (mean over seeds [{conf} t interval]):",
        "",
        kind_table(rows),
        "",
        *(("The final evaluations from their per-task records (paired by seed and task; * excludes 0):", "",
           table, "") if (table := evaluation_table(runs, bench.confidence)) else ()),
        f"A training step itemized (mean over the last {last} steps; train s: summed step times per run):",
        "",
        timing_table(rows, last),
        "",
    ]
    lines += [f"![{name}]({p.name})" for name, p in plots.items()]
    return "\n".join(lines) + "\n"


def _trainer_summary(runs: Sequence[RunResult]) -> str:
    """The shared budget, read from the first run's config.json (the same for all, see BUDGET_KEYS)."""
    path = runs[0].output_dir / "config.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    t = meta.get("trainer", {})
    a = meta.get("algorithm", {})
    e = meta.get("env", {})
    tools = e.get("tools")
    return (
        f"{t.get('steps')} steps × {t.get('tasks_per_step')} tasks × group {a.get('group_size')}, "
        f"tools {', '.join(tools) if isinstance(tools, (dict, list)) else tools}, "
        f"{t.get('eval_tasks')} held-out tasks x {t.get('eval_samples')} samples"
    )


def write_report(
    bench: BenchConfig, runs: Sequence[RunResult], base: Probe | None
) -> tuple[str, dict[str, Path]]:
    """Write results.csv, results.md and the plots into `bench.output_dir`."""
    from agentenv.bench.plots import write_plots

    out = Path(bench.output_dir)
    steps = max((int(r["step"]) for run in runs for r in run.records if "rollout/reward" in r), default=1)
    last = bench.final_window(steps)
    rows = variant_rows(runs, last, bench.confidence)
    files: dict[str, Path] = {"csv": out / "results.csv", "markdown": out / "results.md"}
    write_csv(rows, files["csv"])
    plots = write_plots(runs, base, out, positions=bench.probe.positions)
    md = markdown_report(bench, runs, rows, last, plots)
    files["markdown"].write_text(md)
    files.update(plots)
    return md, files
