"""agentenv.bench: train several algorithms on the same seeds, tasks and budget; tables and plots.

    agentenv bench configs/bench/quick_toy.yaml [--plan] [trainer.steps=2 seeds=[0] smoke=true]
    agentenv bench configs/bench/quick_toy.yaml ray.address=auto ray.num_cpus=2   # the runs on a Ray cluster

`run_benchmark(path, overrides)` is what the CLI calls; `execute(BenchConfig)`
runs a config built in code. Heavy modules (torch, the trainer, matplotlib)
load when a benchmark runs, not on import.
"""

from agentenv.bench.config import (
    BenchConfig,
    ProbeConfig,
    RunSpec,
    bench_config_from_dict,
    load_bench_config,
    resolve_runs,
)
from agentenv.bench.results import BenchResult, Probe, RunResult
from agentenv.bench.runner import execute, run_benchmark, show_plan
from agentenv.bench.stats import (
    Interval,
    PositionEntropy,
    Spread,
    entropy_by_position,
    paired_interval,
    spread,
    t_interval,
)

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Interval",
    "PositionEntropy",
    "Probe",
    "ProbeConfig",
    "RunResult",
    "RunSpec",
    "Spread",
    "bench_config_from_dict",
    "entropy_by_position",
    "execute",
    "load_bench_config",
    "paired_interval",
    "resolve_runs",
    "run_benchmark",
    "show_plan",
    "spread",
    "t_interval",
]
