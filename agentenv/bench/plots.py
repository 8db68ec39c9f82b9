"""PNG plots of a benchmark with matplotlib's Agg canvas (no pyplot, no display, no global backend)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentenv.bench.results import pool_probes
from agentenv.bench.stats import curve, eval_curve, mean_curve

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.bench.results import Probe, RunResult
    from agentenv.bench.stats import PositionEntropy

# positions reached by fewer segments than this are not drawn (a mean of one or two is noise)
MIN_SEGMENTS = 3


def _masked_mean(pe: PositionEntropy) -> list[float]:
    return [m if c >= MIN_SEGMENTS else float("nan") for m, c in zip(pe.mean, pe.counts)]


def _figure(width: float = 6.4, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _by_variant(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {}
    for r in runs:
        out.setdefault(r.variant, []).append(r)
    return out


def plot_metric_curves(
    runs: Sequence[RunResult],
    key: str,
    ylabel: str,
    title: str,
    path: Path,
    curve_of: Callable[[Sequence[Mapping[str, float]], str], dict[int, float]] = curve,
) -> Path:
    """Mean over seeds of `key` per step (`curve_of`: training steps or evaluations), one line per variant,
    a min–max band over seeds."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    groups = _by_variant(runs)
    drawn = 0
    for color, (name, rs) in zip(_colors(len(groups)), groups.items()):
        steps, mean, lo, hi = mean_curve([curve_of(r.records, key) for r in rs])
        if not steps:
            continue
        ax.plot(steps, mean, marker="o", ms=3, color=color, label=f"{name} ({len(rs)} seeds)")
        drawn += 1
        if len(rs) > 1:
            ax.fill_between(steps, lo, hi, color=color, alpha=0.15, lw=0)
    if not drawn:
        ax.text(0.5, 0.5, f"no run logged {key}", ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title + (" (band: min–max over seeds)" if any(len(rs) > 1 for rs in groups.values()) else ""),
                 fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_entropy_after_tool(
    runs: Sequence[RunResult], base: Probe | None, positions: int, path: Path
) -> Path:
    """The ARPO pilot figure from our rollouts: entropy by token position after a tool result.

    Solid: policy tokens right after a tool result (the env's answer to a
    call, error messages for malformed calls included); dashed: the first
    tokens of the first turn (after the prompt), as a reference. One color per
    variant (seeds pooled), gray for the untrained model. Positions that fewer
    than `MIN_SEGMENTS` segments reach are left out.
    """
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    groups = _by_variant(runs)
    lines = [(n, c, [r.probe for r in rs]) for (n, rs), c in zip(groups.items(), _colors(len(groups)))]
    if base is not None:
        lines.append(("untrained", "0.45", [base]))
    x = list(range(positions))
    drawn = 0
    for name, color, probes in lines:
        tool = pool_probes(probes, "after_tool")
        first = pool_probes(probes, "after_prompt")
        if tool is not None and tool.segments:
            ax.plot(x, _masked_mean(tool), color=color, lw=1.6, label=f"{name}: after tool result ({tool.segments} segs)")
            drawn += 1
        if first is not None and first.segments:
            ax.plot(x, _masked_mean(first), color=color, lw=1.0, ls="--", alpha=0.8, label=f"{name}: first turn")
            drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no policy tokens were measured", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("token position after the tool result (solid) / the prompt (dashed)")
    ax.set_ylabel("entropy (nats)")
    ax.set_title("Token entropy after a tool call (probe rollouts of each final policy)")
    ax.set_xlim(0, positions - 1)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_plots(runs: Sequence[RunResult], base: Probe | None, out: Path, positions: int) -> dict[str, Path]:
    """heldout_accuracy.png, reward_curves.png, tool_calls.png and entropy_after_tool.png in `out`."""
    out = Path(out)
    return {
        "heldout_accuracy": plot_metric_curves(
            runs,
            "eval/accuracy",
            "held-out accuracy",
            "Held-out accuracy during training (mean over seeds)",
            out / "heldout_accuracy.png",
            curve_of=eval_curve,
        ),
        "reward_curves": plot_metric_curves(
            runs,
            "rollout/reward",
            "mean rollout reward",
            "Reward per step (mean over seeds)",
            out / "reward_curves.png",
        ),
        "tool_calls": plot_metric_curves(
            runs,
            "rollout/tool_results_per_group",
            "tool calls per group (shared prefixes once)",
            "Tool calls per step (mean over seeds)",
            out / "tool_calls.png",
        ),
        "entropy_after_tool": plot_entropy_after_tool(runs, base, positions, out / "entropy_after_tool.png"),
    }
