"""A training step's metrics (`step_metrics`, reduced over processes), and their sinks: JSONL, TensorBoard, and
Weights & Biases when asked."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from agentenv.algorithms.base import Algorithm, TrainBatch, own_tool_results
from agentenv.algorithms.core import episode_outcomes, kl_k3
from agentenv.configs import LoggingConfig
from agentenv.rollout.toolstats import ToolStats
from agentenv.tasks.rewards import reward_error_counts
from agentenv.types import Group

if TYPE_CHECKING:
    from accelerate import Accelerator

log = logging.getLogger(__name__)


class MetricsLogger:
    """Writes one record per step. Only the main process should own one.

    A value that is not finite (a NaN loss) is never dropped: JSONL writes it
    as `null` and names it under `"nonfinite"` (`read_metrics` gives it back as
    NaN), TensorBoard and W&B get the NaN itself, and a warning says so.

    Args:
        out_dir: The run's folder.
        cfg: Which sinks.
        run_config: Logged to W&B.
        purge_step: Set on resume (None otherwise): TensorBoard events from
            this step on are discarded (the resumed run writes them again), and
            W&B continues the run whose id `wandb_run.json` in `out_dir` holds.
    """

    WANDB_RUN_FILE = "wandb_run.json"

    def __init__(
        self,
        out_dir: Path,
        cfg: LoggingConfig,
        run_config: Mapping[str, Any] | None = None,
        purge_step: int | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self._jsonl = (self.out_dir / "metrics.jsonl").open("a") if cfg.jsonl else None
        self._tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=purge_step)
        self._wandb = None
        if cfg.wandb:
            self._wandb = self._init_wandb(run_config, resume=purge_step is not None)

    def _init_wandb(self, run_config: Mapping[str, Any] | None, resume: bool) -> Any:
        """A W&B run; on resume the run this folder logged to before (its id is kept in `wandb_run.json`).

        Steps W&B already received past the checkpoint resumed from are not
        rewritten: W&B keeps a run's steps increasing and drops the repeats.
        """
        try:
            import wandb
        except ImportError as e:
            raise ImportError("logging.wandb is true but wandb is not installed: pip install 'agentenv[wandb]'") from e
        id_file = self.out_dir / self.WANDB_RUN_FILE
        run_id = None
        if resume and id_file.exists():
            run_id = json.loads(id_file.read_text())["id"]
        elif resume:
            log.warning("no %s in %s: W&B starts a new run", self.WANDB_RUN_FILE, self.out_dir)
        run = wandb.init(
            project=self.cfg.wandb_project, config=dict(run_config or {}), dir=str(self.out_dir),
            id=run_id, resume="allow",  # id None: W&B picks a new one
        )  # fmt: skip
        id_file.write_text(json.dumps({"id": run.id, "project": self.cfg.wandb_project}))
        return run

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        bad = sorted(k for k, v in values.items() if not math.isfinite(v))
        if bad:
            log.warning("step %d: non-finite metrics %s", step, ", ".join(f"{k}={values[k]}" for k in bad))
        if self._jsonl:
            record: dict[str, Any] = {"step": step, "time": time.time(), **{k: (v if k not in bad else None) for k, v in values.items()}}
            if bad:
                record["nonfinite"] = bad
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The records of a metrics.jsonl file (non-finite values as NaN)."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for rec in records:
        for k in rec.pop("nonfinite", ()):
            rec[k] = math.nan
    return records


def reduce_sum(acc: Accelerator, t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every process of `acc` (an `accelerate.Accelerator`; a collective: each process calls it alike)."""
    if acc.num_processes == 1:
        return t
    return cast(torch.Tensor, acc.reduce(t.to(acc.device), reduction="sum").to(t.device))


def step_metrics(
    groups: list[Group], batch: TrainBatch, loss_metrics: list[dict[str, float]], algorithm: Algorithm,
    tool_names: list[str], acc: Accelerator,
) -> tuple[dict[str, float], ToolStats]:  # fmt: skip
    """A step's rollout and loss metrics: sums reduced across ranks, then turned into means; and the step's tool
    calls over every process (`tool_names`: the run's tools, the same on every process)."""
    trajs = [t for g in groups for t in g]
    mask = batch.loss_mask
    ent = torch.tensor([h for t in trajs for s in t.segments if s.source == "policy" for h in cast(list[float], s.entropies)])
    ent = ent[torch.isfinite(ent)]
    gap = (batch.old_logprobs - batch.sampler_logprobs).abs() * mask
    # sampler vs trainer: k3 estimate of KL(sampler || trainer) over the sampled tokens, and the largest
    # importance ratio pi_trainer / pi_sampler (what `algorithm.rollout_correction` caps)
    mismatch = kl_k3(batch.sampler_logprobs.double(), batch.old_logprobs.double(), mask)
    log_rho = (batch.old_logprobs - batch.sampler_logprobs).masked_fill(mask == 0, -math.inf)
    rewards, correct = episode_outcomes(trajs)
    sums = {
        "n_traj": float(len(trajs)),
        "n_episodes": float(len(rewards)),
        "n_groups": float(len(groups)),
        "reward": sum(rewards),
        "correct": sum(correct),
        "tool_calls": float(sum(t.num_tool_calls for t in trajs)),
        # tool results the env produced: a tree's shared prefixes count once (the paper's tool-call budget)
        "tool_results": float(sum(own_tool_results(t) for t in trajs)),
        # tokens the sampler generated: a tree's shared prefixes count once
        "gen_tokens": float(sum(algorithm.generated_tokens(g) for g in groups)),
        "failed": float(sum(t.failed for t in trajs)),
        "entropy_sum": float(ent.sum()) if ent.numel() else 0.0,
        "entropy_n": float(ent.numel()),
        "gap_sum": float(gap.sum()),
        "gap_n": float(mask.sum()),
        "gap_max": float(gap.max()) if gap.numel() else 0.0,
        "mismatch_kl": float(mismatch.sum()),
        "loss_n": float(len(loss_metrics)),
    }
    local_tools = ToolStats.of(trajs)
    sums.update(local_tools.counts(tool_names))
    sums.update(reward_error_counts(trajs))  # every kind, on every process: the keys must match
    keys = sorted({k for m in loss_metrics for k in m})
    for k in keys:
        sums[f"loss/{k}"] = float(sum(m.get(k, 0.0) for m in loss_metrics))
    names = sorted(sums)
    vec = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=acc.device)
    total = dict(zip(names, acc.reduce(vec, reduction="sum").cpu().tolist()))
    rho_max = float(log_rho.max()) if log_rho.numel() else -math.inf
    maxes = acc.gather(torch.tensor([[sums["gap_max"], rho_max]], dtype=torch.float64, device=acc.device))
    gap_max, rho_max = maxes.max(dim=0).values.tolist()
    n = max(total["n_traj"], 1.0)
    out = {
        "rollout/reward": total["reward"] / max(total["n_episodes"], 1.0),  # by episode, as the group's statistics
        "rollout/accuracy": total["correct"] / max(total["n_episodes"], 1.0),
        "rollout/tool_calls_per_traj": total["tool_calls"] / n,
        "rollout/gen_tokens_per_group": total["gen_tokens"] / max(total["n_groups"], 1.0),
        "rollout/tool_results_per_group": total["tool_results"] / max(total["n_groups"], 1.0),
        "rollout/failed": total["failed"],
        "rollout/trajectories": total["n_traj"],
        "rollout/episodes": total["n_episodes"],
        "rollout/entropy": total["entropy_sum"] / max(total["entropy_n"], 1.0),
        "train/logprob_gap_mean": total["gap_sum"] / max(total["gap_n"], 1.0),
        "train/logprob_gap_max": gap_max,
        "train/mismatch_kl": total["mismatch_kl"] / max(total["gap_n"], 1.0),
        # no policy token: 1; a ratio past float64 (a -inf sampler logprob): inf
        "train/is_ratio_max": 1.0 if rho_max == -math.inf else float(torch.tensor(rho_max, dtype=torch.float64).exp()),
    }
    for k in keys:
        out[f"train/{k}"] = total[f"loss/{k}"] / max(total["loss_n"], 1.0)
    tool_stats = ToolStats.from_counts(
        {k: v for k, v in total.items() if k.startswith(("tool_calls/", "tool_errors/"))}, local_tools.examples
    )
    out.update(tool_stats.metrics("rollout/", tool_names))
    out.update({f"rollout/{k}": v for k, v in total.items() if k.startswith("reward_errors/")})
    return out, tool_stats


def describe(metrics: dict[str, float]) -> str:
    """The progress bar's text: reward, accuracy and the last step's seconds itemized (rollout, old logprobs,
    update, push); with the bar, the count and the clock it fits an 80-column terminal."""
    return (
        f"r={metrics['rollout/reward']:.2f} acc={metrics['rollout/accuracy']:.2f} | "
        f"roll {metrics['time/rollout_s']:.1f} lp {metrics['time/old_logprobs_s']:.1f} "
        f"upd {metrics['time/update_s']:.1f} push {metrics['time/push_s']:.1f} s"
    )


def progress_bar(enabled: bool) -> Any:
    """A `rich` progress bar (shown when `enabled`) for `describe`'s text."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=12), MofNCompleteColumn(), TimeElapsedColumn(), disable=not enabled
    )
