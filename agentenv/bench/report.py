"""The benchmark's report: one row per variant (CSV and markdown) and the plots."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from agentenv.bench.stats import PositionEntropy, Spread, curve, final_mean, spread

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.bench.config import BenchConfig
    from agentenv.bench.runner import Probe, RunResult

# (column stem, metrics.jsonl key) of the rollout metrics averaged over the final steps
ROLLOUT_METRICS = (
    ("reward", "rollout/reward"),
    ("accuracy_train", "rollout/accuracy"),
    ("tool_calls_per_traj", "rollout/tool_calls_per_traj"),
    ("gen_tokens_per_group", "rollout/gen_tokens_per_group"),
    ("entropy", "rollout/entropy"),
    ("step_s", "time/step_s"),
    ("rollout_s", "time/rollout_s"),
    ("old_logprobs_s", "time/old_logprobs_s"),
    ("update_s", "time/update_s"),
    ("push_s", "time/push_s"),
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
        heldout_tool_calls: Tool calls per held-out task over seeds.
        rollout: Column stem -> spread over seeds of each seed's mean over the
            last `final_steps` training steps (see `ROLLOUT_METRICS`).
        wall_s: Wall time per run (trainer build, training, final eval; the
            first run also pays for imports and index builds).
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
    heldout_tool_calls: Spread
    rollout: dict[str, Spread]
    wall_s: Spread
    train_s: Spread
    entropy_after_tool: float
    entropy_first_turn: float


def pool_probes(probes: Sequence["Probe | None"], attr: str) -> PositionEntropy | None:
    """Sum the per-position sums and counts of every run's probe."""
    parts = [getattr(p, attr) for p in probes if p is not None]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def early_mean(pe: PositionEntropy | None, k: int = EARLY_POSITIONS) -> float:
    """Token-weighted mean entropy over positions 0..k-1 (nan when empty)."""
    if pe is None:
        return float("nan")
    n = sum(pe.counts[:k])
    return sum(pe.sums[:k]) / n if n else float("nan")


def variant_rows(runs: Sequence["RunResult"], last: int) -> list[VariantRow]:
    """Aggregate runs into one row per variant (in the order variants first appear)."""
    order: list[str] = []
    by: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.variant not in by:
            order.append(r.variant)
            by[r.variant] = []
        by[r.variant].append(r)
    rows = []
    for name in order:
        rs = by[name]
        rows.append(
            VariantRow(
                variant=name,
                algorithm=rs[0].algorithm,
                seeds=[r.seed for r in rs],
                heldout_accuracy=spread(r.eval.get("accuracy", math.nan) for r in rs),
                heldout_tool_calls=spread(r.eval.get("tool_calls", math.nan) for r in rs),
                rollout={stem: spread(final_mean(r.records, key, last) for r in rs) for stem, key in ROLLOUT_METRICS},
                wall_s=spread(r.wall_s for r in rs),
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
    cols += ["heldout_tool_calls_mean", "heldout_tool_calls_std"]
    for stem, _ in ROLLOUT_METRICS:
        cols += [f"{stem}_mean", f"{stem}_std"]
    cols += ["train_s_mean", "train_s_std", "wall_s_mean", "wall_s_std"]
    cols += ["entropy_after_tool_0_9", "entropy_first_turn_0_9"]
    return cols


def csv_row(row: VariantRow) -> list[Any]:
    a = row.heldout_accuracy
    vals: list[Any] = [row.variant, row.algorithm, len(row.seeds), " ".join(map(str, row.seeds))]
    vals += [a.mean, a.std, a.min, a.max, row.heldout_tool_calls.mean, row.heldout_tool_calls.std]
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


def markdown_table(rows: Sequence[VariantRow], last: int) -> str:
    """The report table: one row per variant, mean ± std over seeds."""
    head = [
        "variant",
        "algorithm",
        "seeds",
        "held-out acc",
        "acc min–max",
        f"reward (last {last})",
        "tool calls/traj",
        "gen tokens/group",
        "H after tool (0-9)",
        "train s/run",
        "rollout s/step",
        "old-lp s/step",
        "update s/step",
        "push s/step",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
    for r in rows:
        a = r.heldout_accuracy
        h = "n/a" if math.isnan(r.entropy_after_tool) else f"{r.entropy_after_tool:.3f}"
        cells = [
            r.variant,
            r.algorithm,
            str(len(r.seeds)),
            _pm(a),
            "n/a" if a.n == 0 else f"{a.min:.3f}–{a.max:.3f}",
            _pm(r.rollout["reward"]),
            _pm(r.rollout["tool_calls_per_traj"], "{:.2f}"),
            _pm(r.rollout["gen_tokens_per_group"], "{:.0f}"),
            h,
            _pm(r.train_s, "{:.0f}"),
            *(_pm(r.rollout[k], "{:.2f}") for k in ("rollout_s", "old_logprobs_s", "update_s", "push_s")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(
    bench: "BenchConfig", runs: Sequence["RunResult"], rows: Sequence[VariantRow], last: int, plots: dict[str, Path]
) -> str:
    """Title, the shared budget, how to read the columns, the table, the plots."""
    tc = _trainer_summary(runs)
    lines = [
        f"# {bench.name}",
        "",
        f"{len(rows)} variants × {len(bench.seeds)} seeds ({', '.join(map(str, bench.seeds))}); {tc}.",
        f"Held-out accuracy: the trainer's final evaluation; mean ± sample std over seeds. "
        f"Rollout columns: mean over the last {last} training steps. "
        f"H after tool: mean entropy (nats) of the first {EARLY_POSITIONS} tokens after a tool result, "
        f"from {bench.probe.samples} rollouts × {bench.probe.tasks} held-out tasks of each final policy. "
        "train s: summed step times (rollout + update) per run; the s/step columns itemize a step "
        f"(mean over the last {last} steps): rollout, old-logprob recompute, update (forward, backward, "
        "optimizer), weight push.",
        "",
        markdown_table(rows, last),
        "",
    ]
    lines += [f"![{name}]({p.name})" for name, p in plots.items()]
    return "\n".join(lines) + "\n"


def _trainer_summary(runs: Sequence["RunResult"]) -> str:
    """The shared budget, read from the first run's config.json (the same for all, see BUDGET_KEYS)."""
    path = runs[0].output_dir / "config.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    t = meta.get("trainer", {})
    a = meta.get("algorithm", {})
    e = meta.get("env", {})
    return (
        f"{t.get('steps')} steps × {t.get('tasks_per_step')} tasks × group {a.get('group_size')}, "
        f"tools {e.get('tools')}, {t.get('eval_tasks')} held-out tasks"
    )


def write_report(
    bench: "BenchConfig", runs: Sequence["RunResult"], base: "Probe | None"
) -> tuple[str, dict[str, Path]]:
    """Write results.csv, results.md and the plots into `bench.output_dir`."""
    from agentenv.bench.plots import write_plots

    out = Path(bench.output_dir)
    steps = max((int(r["step"]) for run in runs for r in run.records if "rollout/reward" in r), default=1)
    last = bench.final_window(steps)
    rows = variant_rows(runs, last)
    files: dict[str, Path] = {"csv": out / "results.csv", "markdown": out / "results.md"}
    write_csv(rows, files["csv"])
    plots = write_plots(runs, base, out, positions=bench.probe.positions)
    md = markdown_report(bench, runs, rows, last, plots)
    files["markdown"].write_text(md)
    files.update(plots)
    return md, files
