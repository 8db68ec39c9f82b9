"""Metrics sinks: JSONL, TensorBoard, and Weights & Biases when asked."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentenv.configs import LoggingConfig

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
