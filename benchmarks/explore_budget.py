"""ARPO's exploration claim at an equal tool-call budget, without training (`agentenv.bench.explore`).

One fixed model; for each held-out task, the same tool-call budget B spent by
GRPO's sampler, by independent sampling with the tree's number of answers
(extra answers resampled at zero tool calls), by ARPO's tree (the run
config's thresholds), by a tree that branches at random probes, and (with
`--minority-tau`) by the entropy rule at a threshold only a minority of
probes pass; the same seeds in every arm; the env counts and caps the calls.
Every trajectory is one record; the report (`agentenv.bench.explore_report`)
computes pass@budget, majority-vote and top-scored accuracy, accuracy per
trajectory and pass@k at a matched k from them, with Wilson and t intervals,
exact McNemar tests, Holm's correction and the smallest difference each
comparison detects.

    python benchmarks/explore_budget.py configs/toy_arpo.yaml "env.tasks.kinds=[twohop, both]" env.tasks.n_heldout=150 \\
        --tasks 300 --budgets 4 8 [--minority-tau 0.502] [--checkpoint DIR] [--out DIR] [--resume]

Writes into `--out`: `records.jsonl.gz` (one line per trajectory, appended as
each chunk of tasks finishes), `table.md`, and `curves.png` (accuracy against
tool calls and tokens over the budgets). `--resume` keeps the records already
there and measures only the (budget, task) pairs they lack, each with the seed
an uninterrupted run gives it. `--report-only` samples nothing and reports
`--out`'s records (`--merge` pools other directories' records of the same
tasks: a run at more budgets on a subset of the tasks, for the curves).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import sys
import time
from pathlib import Path

ARPO_KEYS = ("alpha", "beta", "tau", "entropy_window", "forks_per_branch", "branch_rule", "fork_decision", "entropy_norm")
RECORDS = "records.jsonl.gz"


def read_records(out: Path) -> list:
    from agentenv.bench.explore import TrajRecord

    path = out / RECORDS
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [TrajRecord(**json.loads(line)) for line in f if line.strip()]


def write_records(path: Path, records: list, mode: str) -> None:
    with gzip.open(path, mode + "t") as f:
        f.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in records)


def delta_h_quantiles(records: list, arm: str = "arpo") -> str:
    """ΔH at the probes of one tree arm: the quantiles a minority threshold is chosen from."""
    import numpy as np

    dh = np.array([p[0] for r in records if r.arm == arm for p in r.probes], dtype=float)
    if dh.size == 0:
        return f"no probes in arm {arm!r}"
    qs = {q: float(np.quantile(dh, q)) for q in (0.5, 0.75, 0.9)}
    return f"ΔH at {dh.size} probes of {arm}: " + ", ".join(f"q{int(q * 100)} {v:+.5f}" for q, v in qs.items())


def prefix_caching(cfg) -> str:
    """Whether the engine's prefix cache makes the re-read tokens (nearly) free."""
    backend = cfg.policy.backend
    if backend == "vllm":
        on = cfg.policy.backend_config("vllm", model="tiny", dtype="float32", seed=0).enable_prefix_caching
        return f"backend vllm, prefix caching {'on: re-read tokens are cache hits' if on else 'off: re-read tokens are prefilled'}"
    return f"backend {backend}: re-read tokens are prefilled unless its kept caches hold them"


def write_report(out: Path, records: list, head: str) -> str:
    from agentenv.bench.explore_report import plot_curves, report

    text, rows, _ = report(records)
    table = head + "\n" + text + "\n\n" + delta_h_quantiles(records) + "\n"
    (out / "table.md").write_text(table)
    if len({r.budget for r in rows}) > 1:
        plot_curves(rows, str(out / "curves.png"))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="a run config: model, policy, env (tasks, tools) and ARPO's thresholds")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the run config")
    ap.add_argument("--checkpoint", default=None, help="a model directory instead of model.path")
    ap.add_argument("--tasks", type=int, default=300, help="the first N held-out tasks, kinds in turn (as `agentenv eval` takes them)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--cap-per-call", type=int, default=4, help="most trajectories per task and arm: this x B")
    ap.add_argument("--width", type=int, default=2, help="episodes in flight per task (ARPO's N initial paths)")
    ap.add_argument("--random-tau", type=float, default=0.5, help="the random tree's branching probability per probe")
    ap.add_argument("--minority-tau", type=float, default=None,
                    help="τ of the arpo_minority arm (threshold rule): α + β·q for a high quantile q of ΔH")  # fmt: skip
    ap.add_argument("--calibrate", type=int, default=0, metavar="N",
                    help="first run the arpo tree alone on N of the measured tasks under another seed (--seed + 1; "
                         "only its probes are read, never an answer) and set --random-tau to its share of probes "
                         "that branched and --minority-tau to the ΔH threshold a quarter of its probes pass")  # fmt: skip
    ap.add_argument("--tasks-at-once", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/explore_budget")
    ap.add_argument("--resume", action="store_true", help="keep --out's records; measure only what they lack")
    ap.add_argument("--report-only", action="store_true", help="sample nothing: the report of --out's records")
    ap.add_argument("--merge", nargs="*", default=[],
                    help="with --report-only: more record directories to pool (their records of --out's tasks)")  # fmt: skip
    args = ap.parse_args()

    from agentenv.bench.explore import ExploreConfig, budgeted_env_factory, default_trees, explore
    from agentenv.bench.explore_report import calibrate

    out = Path(args.out)
    if args.report_only:
        got = read_records(out)
        ids = {r.task_id for r in got}
        got += [r for d in args.merge for r in read_records(Path(d)) if r.task_id in ids]
        head = (out / "table.md").read_text().split("\n\n")[0] if (out / "table.md").exists() else ""
        print(write_report(out, got, head), flush=True)
        return
    if not args.config:
        ap.error("a run config is needed unless --report-only")
    from agentenv.configs import load_config
    from agentenv.tasks import balanced_subset
    from agentenv.training.build import build_runtime

    cfg = load_config(args.config, args.overrides)
    algo = cfg.algorithm_config
    arpo = {k: getattr(algo, k) for k in ARPO_KEYS if hasattr(algo, k)}
    if args.resume and args.calibrate:
        ap.error("--resume keeps the first run's thresholds: give its --random-tau and --minority-tau (its table.md "
                 "says them) instead of --calibrate")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    kept = read_records(out) if args.resume else []
    t0 = time.perf_counter()
    rt = build_runtime(cfg, args.checkpoint)
    start_s = time.perf_counter() - t0
    env_for = lambda b: budgeted_env_factory(cfg.env, rt.tools, rt.tokenizer, b)  # noqa: E731
    params = cfg.policy.sampling_params()
    tasks = balanced_subset(rt.tasks.heldout, args.tasks)
    if len(tasks) < args.tasks:
        print(f"warning: only {len(tasks)} held-out tasks (asked for {args.tasks})", file=sys.stderr)

    def progress(msg: str) -> None:
        print(f"[explore {time.perf_counter() - t0:.0f}s] {msg}", file=sys.stderr, flush=True)

    pilot_tasks = balanced_subset(tasks, args.calibrate)  # the measured tasks' own probes, under another seed
    calibration = ""

    async def sample() -> tuple[ExploreConfig, list, list]:
        nonlocal calibration
        if args.calibrate:  # one event loop for the pilot and the run: the engine's client is bound to it
            pilot = ExploreConfig(tuple(args.budgets), args.cap_per_call, args.width, arpo, {"arpo": {}}, False,
                                  args.tasks_at_once, args.seed + 1)  # fmt: skip
            got = await explore(pilot, rt.policy, env_for, rt.tokenizer, pilot_tasks, params, progress)
            try:
                args.random_tau, args.minority_tau, calibration = calibrate(got, arpo.get("alpha", 0.5), arpo.get("beta", 0.2))
            except ValueError as e:
                raise SystemExit(f"calibration: {e}") from None
            progress(calibration)
        ex = ExploreConfig(tuple(args.budgets), args.cap_per_call, args.width, arpo,
                           default_trees(args.random_tau, args.minority_tau), True, args.tasks_at_once, args.seed)  # fmt: skip
        have = {(r.budget, r.task_id, r.arm) for r in kept}
        done = {(b, t) for b, t, _ in have if all((b, t, a) in have for a in ex.arms)}
        keep = [r for r in kept if (r.budget, r.task_id) in done]
        write_records(out / RECORDS, keep, "w")
        new = await explore(ex, rt.policy, env_for, rt.tokenizer, tasks, params, progress, done=done,
                            on_chunk=lambda rs: write_records(out / RECORDS, rs, "a"))  # fmt: skip
        return ex, keep, new

    t1 = time.perf_counter()
    try:
        ex, kept, new = asyncio.run(sample())
    finally:
        asyncio.run(rt.aclose())
    run_s = time.perf_counter() - t1
    ids = {t.id for t in tasks}
    records = [r for r in kept if r.budget in args.budgets and r.task_id in ids] + new
    kinds = ", ".join(map(str, cfg.env.tasks.options.get("kinds", ["?"])))
    head = (
        f"model {args.checkpoint or cfg.model.path}; {len(tasks)} held-out tasks ({kinds}); budgets {args.budgets}; "
        f"arms {list(ex.arms)}; trees {ex.trees}; at most {args.cap_per_call} x B trajectories, {ex.width} in flight "
        f"per task; ARPO {arpo}; temperature {params.temperature}; {prefix_caching(cfg)}; "
        f"engine start {start_s:.0f} s, sampling {run_s:.0f} s" + (f"; {calibration}" if calibration else "")
        + (f" (resumed: {len(new)} records sampled now, {len(records) - len(new)} kept)" if args.resume else "")
        + "\n"
        f"command: python benchmarks/explore_budget.py {' '.join(sys.argv[1:])}\n"
    )
    print(write_report(out, records, head), flush=True)


if __name__ == "__main__":
    main()
