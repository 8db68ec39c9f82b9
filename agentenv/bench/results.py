"""What a benchmark leaves behind: the entropy probe, one run's result, the whole benchmark's.

Plain data, imported by the runner that makes it and by the report and plots
that read it (which the runner calls): no module of the three imports another
for these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.bench.config import BenchConfig
from agentenv.bench.stats import PositionEntropy


@dataclass
class Probe:
    """Entropy by position of one policy's rollouts on held-out tasks.

    Attributes:
        after_tool: Policy segments that follow a tool result.
        after_prompt: First policy segments (after the prompt), as a reference.
        episodes: Episodes rolled out.
        tool_calls: Mean tool calls per episode.
    """

    after_tool: PositionEntropy
    after_prompt: PositionEntropy
    episodes: int = 0
    tool_calls: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "after_tool": self.after_tool.to_dict(),
            "after_prompt": self.after_prompt.to_dict(),
            "episodes": self.episodes,
            "tool_calls": self.tool_calls,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Probe:
        return cls(
            PositionEntropy.from_dict(d["after_tool"]),
            PositionEntropy.from_dict(d["after_prompt"]),
            int(d["episodes"]),
            float(d["tool_calls"]),
        )


@dataclass
class RunResult:
    """What one (variant, seed) run left behind.

    Attributes:
        variant, seed: Which run.
        algorithm: `algorithm.name` of the run.
        output_dir: The run's directory.
        wall_s: Wall time of building the trainer, training and its evaluations.
        probe_s: Wall time of the entropy probe (0 when off).
        eval: The trainer's final held-out report (`eval.json`), or {} if none.
        records: The run's metrics.jsonl records.
        probe: Entropy probe of the final policy (None when probing is off).
    """

    variant: str
    seed: int
    algorithm: str
    output_dir: Path
    wall_s: float
    eval: dict[str, Any]
    records: list[dict[str, float]]
    probe: Probe | None
    probe_s: float = 0.0


@dataclass
class BenchResult:
    """Everything a benchmark produced.

    Attributes:
        config: The benchmark config.
        runs: One result per (variant, seed), variants in config order.
        base_probe: The untrained model's probe, if asked for.
        markdown: The report's markdown (also in `files["markdown"]`).
        files: Name -> path of every table and plot written.
    """

    config: BenchConfig
    runs: list[RunResult]
    base_probe: Probe | None
    markdown: str
    files: dict[str, Path]


def pool_probes(probes: Sequence[Probe | None], attr: str) -> PositionEntropy | None:
    """Sum the per-position sums and counts of every run's probe."""
    parts = [getattr(p, attr) for p in probes if p is not None]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total
