"""The run's health: tools that fail are named as the run goes, and a run that can no longer learn stops, saying why."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

from agentenv.configs import TrainerConfig
from agentenv.errors import TrainingStopped
from agentenv.rollout.toolstats import ToolStats
from agentenv.training import checkpoint as ckpt
from agentenv.types import Group


class HealthMonitor:
    """Watches each step's trajectories, tool calls, loss and weights (`check`), and warns of failing tools.

    Args:
        tc: The `trainer` section (its patience: `max_failed_steps`, `nonfinite_patience`).
        tools: The run's tool names.
        out: The run's folder (its checkpoints are named when the run stops).
        main: Whether this is the main process (the one that prints warnings).
    """

    def __init__(self, tc: TrainerConfig, tools: list[str], out: Path, main: bool):
        self.tc = tc
        self.tools = sorted(tools)
        self.out = out
        self.main = main
        self.tool_stats = ToolStats()  # the last step's tool calls, over every process
        self.errors: Counter[str] = Counter()  # the last step's failed trajectories' errors, on this process
        self._failed_streak = 0  # consecutive steps in which every trajectory failed
        self._nonfinite_streak = 0  # consecutive steps with a non-finite loss or gradient
        self._tool_streak: Counter[str] = Counter()  # tool -> consecutive steps in which most of its calls failed

    def record(self, groups: list[Group], tool_stats: ToolStats) -> None:
        """A step's groups (this process's) and its tool calls (over every process)."""
        self.errors = Counter(t.error or "unknown error" for g in groups for t in g if t.failed)
        self.tool_stats = tool_stats

    def warn_tools(self, stats: ToolStats, where: str) -> None:
        """One warning line per tool that failed more than a fifth of its calls (main process)."""
        if self.main:
            for line in stats.warnings(where):
                print(f"[train] warning: {line}", file=sys.stderr, flush=True)

    def check(self, step: int, metrics: dict[str, float]) -> None:
        """Stop a run that can no longer learn, with the reason; called after each step is logged.

        Raises:
            TrainingStopped: Every trajectory failed in `trainer.max_failed_steps`
                consecutive steps; the loss or gradient was not finite in
                `trainer.nonfinite_patience` consecutive steps; or the weights
                are no longer finite (at once: nothing after this can be saved).
        """
        tc = self.tc
        last = ckpt.latest_checkpoint(self.out)
        saved = f"the last checkpoint is {last}" if last is not None else "no checkpoint was written"
        if not metrics["train/weights_finite"]:
            raise TrainingStopped(
                f"the weights stopped being finite at step {step} (trainer.lr={tc.lr:g}, trainer.max_grad_norm="
                f"{tc.max_grad_norm:g}); lower trainer.lr. Nothing was saved from this step; {saved}"
            )
        n = metrics["rollout/trajectories"]
        all_failed = n > 0 and metrics["rollout/failed"] >= n
        self._failed_streak = self._failed_streak + 1 if all_failed else 0
        if self._failed_streak >= tc.max_failed_steps:
            common = self.errors.most_common(1)
            why = f"{common[0][0]!r} ({common[0][1]} of {sum(self.errors.values())})" if common else "unknown"
            raise TrainingStopped(
                f"every trajectory failed in {self._failed_streak} consecutive steps (up to step {step}; "
                f"trainer.max_failed_steps={tc.max_failed_steps}). Most common error on this process: {why}. "
                f"Fix its cause, or raise trainer.max_failed_steps to ride out a longer outage; {saved}"
            )
        stats = self.tool_stats
        for tool in self.tools:
            most_failed = stats.calls[tool] > 0 and stats.failure_share(tool) > 0.5
            self._tool_streak[tool] = self._tool_streak[tool] + 1 if most_failed else 0
            if self._tool_streak[tool] >= tc.max_failed_steps:
                kind, n, text = stats.commonest(tool) or ("error", 0, "")
                raise TrainingStopped(
                    f"the {tool} tool failed most of its calls in {self._tool_streak[tool]} consecutive steps (up to "
                    f"step {step}: {stats.failures(tool)} of {stats.calls[tool]} in the last; trainer.max_failed_steps="
                    f"{tc.max_failed_steps}); commonest: {kind}" + (f": {text}" if text else "")
                    + f". Fix the tool (env.tools.{tool}) or its cause; {saved}"
                )
        loss_keys = [k for k in metrics if k.startswith("train/") and "loss" in k]
        nonfinite = metrics["train/skipped_updates"] > 0 or any(not math.isfinite(metrics[k]) for k in loss_keys)
        self._nonfinite_streak = self._nonfinite_streak + 1 if nonfinite else 0
        if self._nonfinite_streak >= tc.nonfinite_patience:
            raise TrainingStopped(
                f"the loss or gradient norm was not finite in {self._nonfinite_streak} consecutive steps (up to step "
                f"{step}; trainer.nonfinite_patience={tc.nonfinite_patience}); their updates were skipped. "
                f"Lower trainer.lr ({tc.lr:g}) or check the data; {saved}"
            )
