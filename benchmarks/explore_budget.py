"""ARPO's exploration claim at an equal tool-call budget, without training (`agentenv.bench.explore`).

One fixed model; for each held-out task, the same tool-call budget B spent by
GRPO's sampler (independent trajectories) and by ARPO's tree (its sampler and
the thresholds of the run config's `algorithm` section), with the same seeds;
the env counts and caps the calls. Paired by task, with 95% t intervals over
tasks: pass@budget, distinct final answers, correct trajectories per tool
call, tool calls and generated tokens spent, trajectories run.

    python benchmarks/explore_budget.py configs/toy_arpo.yaml "env.tasks.kinds=[twohop, both]" env.tasks.n_heldout=150 \\
        --tasks 300 --budgets 4 8 [--checkpoint DIR] [--out benchmarks/results/explore_tiny] [--resume]

Prints the markdown table and writes `outcomes.jsonl` (one line per task,
sampler and budget, appended as each chunk of tasks finishes) and `table.md`
into `--out`. `--resume` keeps the outcomes already in `outcomes.jsonl` and
measures only the (budget, task) pairs missing there, each with the seed an
uninterrupted run gives it (a stopped run loses only its chunk in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

ARPO_KEYS = ("alpha", "beta", "tau", "entropy_window", "forks_per_branch", "branch_rule", "fork_decision", "entropy_norm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a run config: model, policy, env (tasks, tools) and ARPO's thresholds")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the run config")
    ap.add_argument("--checkpoint", default=None, help="a model directory instead of model.path")
    ap.add_argument("--tasks", type=int, default=300, help="the first N held-out tasks, kinds in turn (as `agentenv eval` takes them)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--max-trajectories", type=int, default=16, help="cap per task and sampler (GRPO's G, ARPO's M)")
    ap.add_argument("--width", type=int, default=2, help="episodes in flight per task (ARPO's N initial paths)")
    ap.add_argument("--tasks-at-once", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/explore_budget")
    ap.add_argument("--resume", action="store_true", help="keep --out's outcomes.jsonl; measure only what it lacks")
    ap.add_argument("--report-only", action="store_true",
                    help="sample nothing: the table of --out's outcomes.jsonl (a stopped run's), printed")  # fmt: skip
    args = ap.parse_args()

    from agentenv.bench.explore import ExploreConfig, Outcome, budgeted_env_factory, explore, markdown, paired_rows
    from agentenv.configs import load_config
    from agentenv.tasks import balanced_subset
    from agentenv.training.build import build_runtime

    if args.report_only:
        got = [Outcome(**json.loads(line)) for line in (Path(args.out) / "outcomes.jsonl").read_text().splitlines()]
        n = len({o.task_id for o in got})
        print(f"{n} tasks; budgets {sorted({o.budget for o in got})}\n\n" + markdown(paired_rows(got), n), flush=True)
        return
    cfg = load_config(args.config, args.overrides)
    algo = cfg.algorithm_config
    arpo = {k: getattr(algo, k) for k in ARPO_KEYS if hasattr(algo, k)}
    ex = ExploreConfig(tuple(args.budgets), args.max_trajectories, args.width, arpo, args.tasks_at_once, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "outcomes.jsonl"
    kept = [Outcome(**json.loads(line)) for line in path.read_text().splitlines()] if args.resume and path.exists() else []
    have = {(o.budget, o.task_id, o.sampler) for o in kept}
    done = {(b, t) for b, t, _ in have if {(b, t, "grpo"), (b, t, "arpo")} <= have}
    t0 = time.perf_counter()
    rt = build_runtime(cfg, args.checkpoint)
    start_s = time.perf_counter() - t0
    tasks = balanced_subset(rt.tasks.heldout, args.tasks)
    if len(tasks) < args.tasks:
        print(f"warning: only {len(tasks)} held-out tasks (asked for {args.tasks})", file=sys.stderr)
    params = cfg.policy.sampling_params()

    def progress(msg: str) -> None:
        print(f"[explore {time.perf_counter() - t0:.0f}s] {msg}", file=sys.stderr, flush=True)

    kept = [o for o in kept if (o.budget, o.task_id) in done]
    with path.open("w") as f:
        f.writelines(json.dumps(dataclasses.asdict(o)) + "\n" for o in kept)

    def write(chunk: list[Outcome]) -> None:
        with path.open("a") as f:
            f.writelines(json.dumps(dataclasses.asdict(o)) + "\n" for o in chunk)

    t1 = time.perf_counter()
    try:
        new = asyncio.run(
            explore(ex, rt.policy, lambda b: budgeted_env_factory(cfg.env, rt.tools, rt.tokenizer, b), rt.tokenizer,
                    tasks, params, progress, done=done, on_chunk=write)  # fmt: skip
        )
    finally:
        asyncio.run(rt.aclose())
    run_s = time.perf_counter() - t1
    ids = {t.id for t in tasks}
    outcomes = [o for o in kept if o.budget in args.budgets and o.task_id in ids] + new
    kinds = ", ".join(map(str, cfg.env.tasks.options.get("kinds", ["?"])))
    head = (
        f"model {args.checkpoint or cfg.model.path}; {len(tasks)} held-out tasks ({kinds}); "
        f"budgets {args.budgets}; at most {ex.max_trajectories} trajectories, {ex.width} in flight per task; "
        f"ARPO {arpo}; temperature {params.temperature}; engine start {start_s:.0f} s, sampling {run_s:.0f} s"
        + (f" (resumed: {len(new)} outcomes sampled now, {len(outcomes) - len(new)} kept)" if args.resume else "")
        + "\n"
        f"command: python benchmarks/explore_budget.py {' '.join(sys.argv[1:])}\n"
    )
    table = head + "\n" + markdown(paired_rows(outcomes), len(tasks)) + "\n"
    (out / "table.md").write_text(table)
    print(table, flush=True)


if __name__ == "__main__":
    main()
