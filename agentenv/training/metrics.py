"""Metrics sinks: JSONL, TensorBoard, and Weights & Biases when asked."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

from agentenv.configs import LoggingConfig


class MetricsLogger:
    """Writes one record per step. Only the main process should own one."""

    def __init__(self, out_dir: Path, cfg: LoggingConfig, run_config: Mapping[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self._jsonl = (self.out_dir / "metrics.jsonl").open("a") if cfg.jsonl else None
        self._tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        self._wandb = None
        if cfg.wandb:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logging.wandb is true but wandb is not installed: pip install 'agentenv[wandb]'") from e
            self._wandb = wandb.init(project=cfg.wandb_project, config=dict(run_config or {}), dir=str(self.out_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if self._jsonl:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
            self._jsonl.flush()
        if self._tb:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb:
            self._wandb.log(clean, step=step)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
