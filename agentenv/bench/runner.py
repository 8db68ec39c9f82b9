"""The benchmark runner: train every variant on every seed, probe, report.

Runs go one after another in this process, each into its own directory
(`output_dir/runs/<variant>/seed<seed>/`, the trainer's usual files plus
`probe.json` and `bench_run.json`). The held-out accuracy is the trainer's
final evaluation (`eval.json`). The entropy probe then rolls out the final
checkpoint on held-out tasks at the training temperature, because the trainer
closes its policy when it finishes and its greedy evaluation keeps no
trajectories.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.bench.config import BenchConfig, ProbeConfig, RunSpec, load_bench_config, resolve_runs
from agentenv.tasks.task import balanced_subset
from agentenv.bench.stats import PositionEntropy, entropy_by_position
from agentenv.configs import RunConfig

RUN_FILE = "bench_run.json"
PROBE_FILE = "probe.json"


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
    def from_dict(cls, d: dict[str, Any]) -> "Probe":
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
        wall_s: Wall time of building the trainer, training and the final eval.
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


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _json_roundtrip(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


# --------------------------------------------------------------------------- probe
async def _probe_async(cfg: RunConfig, model_path: str, probe: ProbeConfig) -> Probe:
    from agentenv.rollout import derive_seed, run_group
    from agentenv.training.build import build_runtime

    rt = build_runtime(cfg, model_path)
    try:
        tasks = balanced_subset(rt.tasks.heldout, probe.tasks)
        params = cfg.policy.sampling_params()
        # the same probe seeds for every variant of a seed: differences come from the policy
        groups = await asyncio.gather(
            *(
                run_group(rt.policy, rt.make_env, t, probe.samples, params, seed=derive_seed(cfg.trainer.seed, 0xB3, i),
                          config=cfg.rollout)  # fmt: skip
                for i, t in enumerate(tasks)
            )
        )
    finally:
        await rt.aclose()
    trajs = [t for g in groups for t in g]
    ok = [t for t in trajs if not t.failed]
    return Probe(
        after_tool=entropy_by_position(trajs, probe.positions, after="tool"),
        after_prompt=entropy_by_position(trajs, probe.positions, after="prompt"),
        episodes=len(trajs),
        tool_calls=sum(t.num_tool_calls for t in ok) / max(1, len(ok)),
    )


def run_probe(cfg: RunConfig, model_path: str, probe: ProbeConfig) -> Probe:
    """Roll out `model_path` on the first `probe.tasks` held-out tasks and measure entropy by position."""
    return asyncio.run(_probe_async(cfg, model_path, probe))


# --------------------------------------------------------------------------- one run
def _load_run(spec: RunSpec, bench: BenchConfig) -> RunResult | None:
    """The finished run in `spec.output_dir`, if it was made by the same config."""
    from agentenv.training.metrics import read_metrics

    meta = _read_json(spec.output_dir / RUN_FILE)
    if not meta:
        return None
    want = {"config": _json_roundtrip(spec.config.to_dict()), "probe": _json_roundtrip(dataclasses.asdict(bench.probe))}
    if meta.get("config") != want["config"] or meta.get("probe") != want["probe"]:
        return None
    probe = _read_json(spec.output_dir / PROBE_FILE)
    return RunResult(
        spec.variant,
        spec.seed,
        spec.config.algorithm.name,
        spec.output_dir,
        float(meta["wall_s"]),
        _read_json(spec.output_dir / "eval.json") or {},
        read_metrics(spec.output_dir / "metrics.jsonl"),
        Probe.from_dict(probe) if probe else None,
    )


def train_run(spec: RunSpec, bench: BenchConfig) -> RunResult:
    """Train one run from scratch (its directory is cleared first), evaluate, probe."""
    from agentenv.training import checkpoint as ckpt
    from agentenv.training.metrics import read_metrics
    from agentenv.training.trainer import Trainer

    if spec.output_dir.exists():
        shutil.rmtree(spec.output_dir)
    t0 = time.perf_counter()
    trainer = Trainer(spec.config)
    result = trainer.train()
    wall = time.perf_counter() - t0
    del trainer
    gc.collect()

    probe = None
    if bench.probe.tasks > 0:
        model_dir = ckpt.checkpoint_dir(spec.output_dir, result.steps) / "model"
        probe = run_probe(spec.config, str(model_dir), bench.probe)
        (spec.output_dir / PROBE_FILE).write_text(json.dumps(probe.to_dict()))
    meta = {
        "variant": spec.variant,
        "seed": spec.seed,
        "wall_s": wall,
        "config": spec.config.to_dict(),
        "probe": dataclasses.asdict(bench.probe),
    }
    # written last: its presence marks the run complete
    (spec.output_dir / RUN_FILE).write_text(json.dumps(meta, indent=1, default=str))
    return RunResult(
        spec.variant,
        spec.seed,
        spec.config.algorithm.name,
        spec.output_dir,
        wall,
        _read_json(spec.output_dir / "eval.json") or {},
        read_metrics(spec.output_dir / "metrics.jsonl"),
        probe,
    )


def base_probe(spec: RunSpec, bench: BenchConfig) -> Probe:
    """The untrained model's probe (once per benchmark; reused while its config holds)."""
    from agentenv.policies.models import resolve_model_path

    d = Path(bench.output_dir) / "runs" / "_base"
    key = {"config": _json_roundtrip(spec.config.to_dict()), "probe": _json_roundtrip(dataclasses.asdict(bench.probe))}
    meta = _read_json(d / RUN_FILE)
    if bench.reuse and meta == key and (d / PROBE_FILE).exists():
        return Probe.from_dict(_read_json(d / PROBE_FILE))
    probe = run_probe(spec.config, resolve_model_path(spec.config.model.path), bench.probe)
    d.mkdir(parents=True, exist_ok=True)
    (d / PROBE_FILE).write_text(json.dumps(probe.to_dict()))
    (d / RUN_FILE).write_text(json.dumps(key))
    return probe


# --------------------------------------------------------------------------- the benchmark
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


def execute(bench: BenchConfig) -> BenchResult:
    """Run (or reuse) every run of `bench`, then write its tables and plots."""
    from agentenv.bench.report import write_report

    specs = resolve_runs(bench)
    out = Path(bench.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_config.json").write_text(json.dumps(dataclasses.asdict(bench), indent=1, default=str))
    base = None
    if bench.probe.tasks > 0 and bench.probe.base_model:
        # first, so the imports and index builds it pays for do not land in a variant's wall time
        _log("probing the untrained model")
        base = base_probe(specs[0], bench)
    runs: list[RunResult] = []
    for i, spec in enumerate(specs, 1):
        tag = f"({i}/{len(specs)}) {spec.variant} seed {spec.seed}"
        done = _load_run(spec, bench) if bench.reuse else None
        if done is not None:
            _log(f"{tag}: reusing {spec.output_dir}")
        else:
            _log(f"{tag}: training into {spec.output_dir}")
            done = train_run(spec, bench)
        _log(f"{tag}: held-out accuracy {done.eval.get('accuracy', float('nan')):.3f}, wall {done.wall_s:.0f} s")
        runs.append(done)
    markdown, files = write_report(bench, runs, base)
    return BenchResult(bench, runs, base, markdown, files)


def run_benchmark(config_path: str | Path, overrides: list[str] | None = None) -> BenchResult:
    """Load a benchmark YAML (with dotted overrides), run it, print the markdown report.

    Args:
        config_path: A benchmark YAML, e.g. `configs/bench/toy_grpo_vs_arpo.yaml`.
        overrides: `dotted.key=value` strings; run sections (`trainer.steps=2`)
            apply to every run, other keys to the benchmark (`seeds=[0]`).

    Returns:
        The runs, the markdown and the paths of the files written.
    """
    bench = load_bench_config(config_path, overrides)
    result = execute(bench)
    print(result.markdown, flush=True)
    return result
