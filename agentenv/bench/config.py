"""Benchmark configs: a base run config, named variants, seeds, one budget.

A benchmark YAML looks like this::

    name: toy_grpo_vs_arpo
    output_dir: runs/bench/toy_grpo_vs_arpo
    seeds: [0, 1, 2]      # at least 3 (95% intervals over seeds); fewer only with smoke: true
    base:                 # a run config: inline sections, or a path (relative to this file)
      env: {tools: [search], tasks: {kinds: [twohop]}}
      trainer: {steps: 6, tasks_per_step: 4}
    base_overrides: []    # dotted overrides applied to every variant's starting config
    variants:             # name -> nested sections, a list of dotted overrides, or a run config file
      grpo: {algorithm: {name: grpo, group_size: 8}}
      arpo_soft: ["algorithm.name=arpo", "algorithm.initial_rollouts=4"]
      arpo_file: ../toy_arpo.yaml            # a whole run config (relative to this file)
      arpo_hard: {config: ../toy_arpo.yaml, algorithm: {advantage: hard}}   # a file, then sections over it
    probe: {tasks: 8, samples: 2}

A run's config starts from the base (or the variant's own `config` file),
then `base_overrides`, then its variant's sections (merged key by key), then
the run overrides given on the command line, then the runner's own
`trainer.seed` (the seed) and `trainer.output_dir`
(`output_dir/runs/<variant>/seed<seed>`). Every variant must share the budget:
tasks, tools, steps, batch and group size, turn length and evaluation, its
seeds included (checked, see `BUDGET_KEYS`).

Pairing: for one seed every variant gets the same `trainer.seed` and the
same task source, so the same training batches (`TaskStream(train,
seed)`), the same per-task sampling seeds (`derive_seed(seed, step,
index)`), the same held-out tasks and the same evaluation seeds; the
differences between variants are then measured seed by seed. An algorithm
that draws extra tasks breaks the batch pairing from its first extra draw on:
DAPO's dynamic sampling takes its refills from the same stream (as DAPO's data
loader does), so its later batches differ; the report's pairing check names
the steps, and its difference still pairs seeds and held-out evaluations.

Sections merge key by key, the `algorithm` section too: a variant
`{algorithm: {name: dapo}}` over a base whose algorithm section sets
`loss_agg` keeps that `loss_agg`. To give a variant its algorithm's own
settings, name its run config (`dapo: ../toy_dapo.yaml`); the plan prints
each variant's algorithm settings that differ from the defaults.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentenv.configs import RunConfig, config_from_dict
from agentenv.errors import ConfigError
from agentenv.loader import apply_overrides, build_dataclass, parse_override

# Sections of a run config; a command-line override starting with one of them
# applies to every run, after the variant.
RUN_SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))

# Dotted keys of the resolved run config that every variant must share, so the
# comparison spends the same budget on the same tasks.
BUDGET_KEYS = (
    "model.path",
    "env",
    "policy.max_turn_tokens",
    "policy.temperature",
    "algorithm.group_size",
    "trainer.steps",
    "trainer.tasks_per_step",
    "trainer.eval_every",
    "trainer.eval_tasks",
    "trainer.eval_samples",
    "trainer.eval_temperature",
    "trainer.eval_seed",
)

# fewest seeds a benchmark may have without `smoke: true` (a t interval needs 2; 3 keeps it finite in width)
MIN_SEEDS = 3

# the key of a variant mapping that names a run config file to start from
CONFIG_KEY = "config"


@dataclass(frozen=True)
class ProbeConfig:
    """Rollouts of each trained policy that measure entropy after tool results.

    Attributes:
        tasks: Held-out tasks to roll out (the first ones of the held-out split).
        samples: Episodes per task, sampled at `policy.temperature`.
        positions: Token positions after a tool result to average over (the
            ARPO paper's pilot figure shows the first ~50).
        base_model: Also probe the untrained model once, as a reference line.
        seeds: Probe only the runs of these seeds (empty: every run). Each
            probe starts an inference engine (about a minute on 2 CPU
            cores), and the pilot figure pools seeds anyway.
    """

    tasks: int = 8
    samples: int = 2
    positions: int = 50
    base_model: bool = True
    seeds: tuple[int, ...] = ()

    def probes(self, seed: int) -> bool:
        """Whether the run of `seed` is probed."""
        return self.tasks > 0 and (not self.seeds or seed in self.seeds)

    def __post_init__(self) -> None:
        for key in ("samples", "positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"probe.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.tasks < 0:
            raise ConfigError("probe.tasks", f"must be >= 0 (0 turns the probe off), got {self.tasks}")


@dataclass(frozen=True)
class RayBenchConfig:
    """Runs of a benchmark on a Ray cluster (the `ray` section); without an address they run here, one by one.

    Every (variant, seed) run is one Ray task with the resources below; as many
    run at once as the cluster's free resources (and `max_parallel`) allow. Each
    writes into the benchmark's `output_dir` as a local run does, so the folder
    must be shared by every node (a local cluster; NFS or the like across
    machines). A finished run is skipped as locally (its `bench_run.json`).

    Attributes:
        address: The cluster (`auto`, `HOST:PORT`, `local` for a one-node cluster
            started here); None: the local, sequential mode (the default).
        num_cpus: CPUs one run reserves.
        num_gpus: GPUs one run reserves (its trainer and engine).
        max_parallel: Most runs in flight at once (0: as the resources allow).
        max_retries: Times a run whose worker died (killed, its node lost) is
            trained again from scratch before the benchmark gives up on it.
        namespace: Ray namespace of the benchmark's tasks.
    """

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_parallel: int = 0
    max_retries: int = 2
    namespace: str = "agentenv-bench"

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ConfigError("ray.num_cpus" if self.num_cpus < 0 else "ray.num_gpus", "must be >= 0")
        if self.max_parallel < 0:
            raise ConfigError("ray.max_parallel", f"must be >= 0 (0: as the resources allow), got {self.max_parallel}")
        if self.max_retries < 0:
            raise ConfigError("ray.max_retries", f"must be >= 0, got {self.max_retries}")


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark: every variant trained on every seed with the same budget.

    Attributes:
        name: Title of the report.
        output_dir: Where runs, tables and plots go.
        seeds: Run seeds (`trainer.seed`); each variant trains once per seed.
            The task generator's seed (`env.tasks.seed`) stays fixed, so all
            runs see the same training and held-out tasks. At least
            `MIN_SEEDS` (3), unless `smoke`.
        smoke: A smoke run: fewer than 3 seeds are allowed (the report then
            has no confidence intervals, or very wide ones).
        confidence: Level of the confidence intervals (Student t over seeds).
        base: The base run config as a mapping of sections (a path in the
            YAML is loaded into this mapping).
        base_overrides: Dotted overrides applied to `base`.
        variants: Variant name -> a mapping of sections merged over the base.
        run_overrides: Dotted overrides applied to every run after its variant
            (the command line's `model.`/`policy.`/`env.`/... overrides).
        final_steps: Rollout metrics in the table are means over the last
            this many training steps (0: half of `trainer.steps`, at least 1).
        probe: Entropy-after-tool probe of the trained policies.
        reuse: Reuse a run whose directory already holds its results under the
            same resolved config (a killed benchmark continues where it stopped).
        ray: Run the runs on a Ray cluster (`ray.address`), several at once.
        control: A positive control: the name of a variant that must lose to
            the first (the update switched off with `trainer.lr=0`, rewards
            permuted, ...). The report checks that its paired difference lies
            below 0 outside the interval, and says plainly that the bench
            resolved nothing when it does not.
    """

    name: str = "bench"
    output_dir: str = "runs/bench"
    seeds: tuple[int, ...] = (0, 1, 2)
    smoke: bool = False
    confidence: float = 0.95
    base: dict[str, Any] = field(default_factory=dict)
    base_overrides: tuple[str, ...] = ()
    variants: dict[str, Any] = field(default_factory=dict)
    run_overrides: tuple[str, ...] = ()
    final_steps: int = 0
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    reuse: bool = True
    ray: RayBenchConfig = field(default_factory=RayBenchConfig)
    control: str = ""

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds", "needs at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", f"must be distinct, got {list(self.seeds)}")
        if len(self.seeds) < MIN_SEEDS and not self.smoke:
            raise ConfigError(
                "seeds",
                f"{list(self.seeds)} has {len(self.seeds)}; a benchmark needs at least {MIN_SEEDS} seeds for its "
                "confidence intervals (set smoke=true for a smoke run with fewer)",
            )
        if not 0 < self.confidence < 1:
            raise ConfigError("confidence", f"must be in (0, 1), got {self.confidence}")
        if not self.variants:
            raise ConfigError("variants", "needs at least one variant (name -> sections or overrides)")
        for name, spec in self.variants.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(name)):
                raise ConfigError(f"variants.{name}", "a variant name may hold only letters, digits, _ . -")
            if not isinstance(spec, dict):
                raise ConfigError(f"variants.{name}", f"expected a mapping of sections, got {spec!r}")
            if CONFIG_KEY in spec and not Path(str(spec[CONFIG_KEY])).is_file():
                raise ConfigError(f"variants.{name}.{CONFIG_KEY}", f"file not found: {spec[CONFIG_KEY]}")
        if self.control and self.control not in self.variants:
            raise ConfigError("control", f"{self.control!r} is not a variant; choose one of {', '.join(self.variants)}")
        if self.control and self.control == next(iter(self.variants)):
            raise ConfigError("control", f"{self.control!r} is the first variant, the reference it must lose to")
        if self.final_steps < 0:
            raise ConfigError("final_steps", f"must be >= 0, got {self.final_steps}")

    def final_window(self, steps: int) -> int:
        """How many last steps the table averages over."""
        return min(steps, self.final_steps) if self.final_steps else max(1, steps // 2)


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark."""

    variant: str
    seed: int
    config: RunConfig
    output_dir: Path


# --------------------------------------------------------------------------- merging
def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, mapping by mapping; other values replace."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def expand_dotted(spec: dict[str, Any]) -> dict[str, Any]:
    """`{"algorithm.name": "arpo"}` -> `{"algorithm": {"name": "arpo"}}` (nested keys too)."""
    out: dict[str, Any] = {}
    for k, v in spec.items():
        v = expand_dotted(v) if isinstance(v, dict) else v
        parts = str(k).split(".")
        node: dict[str, Any] = {}
        cur = node
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
        out = deep_merge(out, node)
    return out


def _config_path(name: str, value: Any, root: Path | None) -> str:
    """A variant's run config file, made absolute (relative paths against the benchmark file's folder)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"variants.{name}.{CONFIG_KEY}", f"expected a path to a run config, got {value!r}")
    p = Path(value)
    p = p if p.is_absolute() else (root or Path.cwd()) / p
    if not p.is_file():
        raise ConfigError(f"variants.{name}.{CONFIG_KEY}", f"file not found: {p}")
    return str(p.resolve())


def _variant_sections(name: str, spec: Any, root: Path | None = None) -> dict[str, Any]:
    """A variant as a mapping of sections (a list of dotted overrides or a run config path is accepted too).

    A path (a string) becomes `{"config": <absolute path>}`; a mapping may hold
    `config: path` beside its sections.
    """
    if spec is None:
        return {}
    if isinstance(spec, str):
        return {CONFIG_KEY: _config_path(name, spec, root)}
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(s, str) for s in spec):
            raise ConfigError(f"variants.{name}", f"a list variant must hold dotted.key=value strings, got {spec!r}")
        return apply_overrides({}, list(spec))
    if not isinstance(spec, dict):
        raise ConfigError(f"variants.{name}", f"expected a mapping of sections or a list of overrides, got {spec!r}")
    sections = expand_dotted({k: v for k, v in spec.items() if k != CONFIG_KEY})
    unknown = [k for k in sections if k not in RUN_SECTIONS]
    if unknown:
        raise ConfigError(
            f"variants.{name}.{unknown[0]}",
            f"unknown section; a variant sets {', '.join(RUN_SECTIONS)} (or names a run config file: {CONFIG_KEY})",
        )
    if CONFIG_KEY in spec:
        sections[CONFIG_KEY] = _config_path(name, spec[CONFIG_KEY], root)
    return sections


# --------------------------------------------------------------------------- loading
def _read_yaml(path: Path, key: str) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(key, f"file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(key, f"{path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(key, f"{path} must hold a mapping, got {type(raw).__name__}")
    return raw


def bench_config_from_dict(
    raw: dict[str, Any], overrides: list[str] | None = None, root: Path | None = None
) -> BenchConfig:
    """Build a BenchConfig from a mapping and command-line overrides.

    Overrides whose first key is a run section (`trainer.steps=2`) go to every
    run after its variant; the others set benchmark keys (`seeds=[0]`,
    `base.trainer.lr=0.01`, `variants.grpo.algorithm.group_size=4`).

    Args:
        raw: The benchmark mapping (the parsed YAML).
        overrides: Dotted `key=value` strings.
        root: Directory that a relative `base` path is resolved against.
    """
    raw = dict(raw or {})
    run_over: list[str] = list(raw.pop("run_overrides", None) or [])
    bench_over: list[str] = []
    for text in overrides or []:
        parts, _ = parse_override(text)
        (run_over if parts[0] in RUN_SECTIONS else bench_over).append(text)
    base = raw.get("base")
    if isinstance(base, str):
        p = Path(base)
        raw["base"] = _read_yaml(p if p.is_absolute() else (root or Path.cwd()) / p, "base")
    elif base is not None and not isinstance(base, dict):
        raise ConfigError("base", f"expected a mapping of sections or a path to a run config, got {base!r}")
    raw = apply_overrides(raw, bench_over)
    variants = raw.get("variants")
    if isinstance(variants, dict):
        raw["variants"] = {str(n): _variant_sections(str(n), s, root) for n, s in variants.items()}
    elif variants is not None:
        raise ConfigError("variants", f"expected a mapping name -> sections, got {variants!r}")
    raw["run_overrides"] = run_over
    return build_dataclass(BenchConfig, raw, "")


def load_bench_config(path: str | Path, overrides: list[str] | None = None) -> BenchConfig:
    """Load a benchmark YAML; a relative `base` path is resolved against the YAML's folder."""
    p = Path(path)
    return bench_config_from_dict(_read_yaml(p, "config"), overrides, root=p.parent)


# --------------------------------------------------------------------------- runs
def _lookup(d: dict[str, Any], dotted: str) -> Any:
    node: Any = d
    for p in dotted.split("."):
        node = node.get(p) if isinstance(node, dict) else None
    return node


def resolve_runs(bench: BenchConfig) -> list[RunSpec]:
    """Every (variant, seed) run with its validated RunConfig, variants in config order.

    Raises:
        ConfigError: A variant's config is invalid (the key is prefixed with
            `variants.<name>`), or two variants differ on a `BUDGET_KEYS` key.
    """
    out_root = Path(bench.output_dir)
    runs: list[RunSpec] = []
    budgets: dict[str, dict[str, Any]] = {}
    for name, spec in bench.variants.items():
        sections = {k: v for k, v in spec.items() if k != CONFIG_KEY}
        start = _read_yaml(Path(spec[CONFIG_KEY]), f"variants.{name}.{CONFIG_KEY}") if CONFIG_KEY in spec else bench.base
        base = apply_overrides(start, list(bench.base_overrides))
        for seed in bench.seeds:
            run_dir = out_root / "runs" / name / f"seed{seed}"
            raw = deep_merge(base, sections)
            extra = list(bench.run_overrides) + [f"trainer.seed={seed}", f"trainer.output_dir={run_dir}"]
            try:
                cfg = config_from_dict(raw, extra)
            except ConfigError as e:
                msg = str(e)[len(e.key) + 2 :] if str(e).startswith(f"{e.key}: ") else str(e)
                raise ConfigError(f"variants.{name}" + (f" -> {e.key}" if e.key else ""), msg) from e
            runs.append(RunSpec(name, seed, cfg, run_dir))
        d = runs[-1].config.to_dict()
        budgets[name] = {k: _lookup(d, k) for k in BUDGET_KEYS}
    first = next(iter(budgets))
    for name, b in budgets.items():
        for k in BUDGET_KEYS:
            if b[k] != budgets[first][k]:
                raise ConfigError(
                    f"variants.{name}",
                    f"differs from {first!r} on the shared budget: {k} is {b[k]!r} in {name!r} "
                    f"but {budgets[first][k]!r} in {first!r}; "
                    "every variant must use the same tasks, seeds and budget (set it in base)",
                )
    # seed by seed: a bench stopped part-way has whole paired seeds, not some variants' every seed
    return sorted(runs, key=lambda r: list(bench.seeds).index(r.seed))
