"""The trainer's wall time for K steps: round-synchronous, the rollout engine (eta = 0) and asynchronous (eta >= 1).

The deep-search shape scaled to this machine: groups of 16, 10 tool calls per
episode with the heavy-tailed latency of `benchmarks/rollout.py` (lognormal,
sigma 1, median `--median-s`), the scripted policy behind its simulated
continuous-batching engine (`--step-ms` per decode step), and a simulated
update: the trainer sleeps as long as the engine's synchronous rollout of one
step took (measured first), then pushes weights (the policy's version goes up).
So the structure shows without model noise.

- round-synchronous: each step rolls out every episode's turn i together, then
  all their tools (`rounds_grpo`), then updates.
- eta = 0: the rollout engine (every trajectory its own coroutine), then the update.
- eta >= 1: `agentenv.training.async_rollout.AsyncRollout`, the producer the
  trainer runs: rollout continues on its loop thread while this thread updates;
  the staleness bound and the requeue of stale groups as in training.

    python benchmarks/async_training.py [--quick] [--steps 16] [--tasks 4] [--etas 1,2,4]
    python benchmarks/async_training.py --tiny [--steps 8]   # the tiny model on CPU: steps per hour, eta 0 and 2

The last line is `speedup over round-synchronous: X.XXx` for the best eta.
`--tiny` trains the embedded tiny model on the toy twohop tasks (hf backend,
the search tool, 2 tasks x 4 trajectories a step) with eta = 0, then eta = 2
(`algorithm.off_policy=decoupled`), and prints steps per hour of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout import Latency, SimServer, latent_factory, rounds_grpo, scripted_turns, scripted_world  # noqa: E402

from agentenv._loops import LoopThread  # noqa: E402
from agentenv.algorithms.grpo import IndependentSampler  # noqa: E402
from agentenv.policies.scripted import ScriptedPolicy  # noqa: E402
from agentenv.rollout import RolloutConfig, derive_seed  # noqa: E402
from agentenv.training.async_rollout import AsyncRollout, Pending, group_versions  # noqa: E402
from agentenv.types import Group, SamplingParams  # noqa: E402

GROUP = 16
CALLS = 10
ROLLOUT = RolloutConfig(episode_timeout_s=3600.0, generation_timeout_s=3600.0, max_concurrency=4096)


class VersionedSim(SimServer):
    """The simulated engine with the scripted policy's weight versions (stamped when a turn starts)."""

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def load_weights(self, named_tensors: Any) -> None:
        self.inner.load_weights(named_tensors)


@dataclass
class Run:
    name: str
    wall_s: float
    tokens: int
    staleness: list[int] = field(default_factory=list)
    dropped: int = 0
    wait_s: float = 0.0  # the trainer waiting for data
    idle_s: float = 0.0  # no group in flight


def world(args: Any) -> tuple[Any, Any, list[Any], SamplingParams]:
    tok, tools, reward, config, tasks = scripted_world("search")
    make_env = latent_factory(tools, tok, reward, config, Latency(args.median_s, seed=args.seed))
    return tok, make_env, tasks, SamplingParams(max_tokens=64, temperature=1.0)


def tokens_of(groups: list[Group]) -> int:
    return sum(t.num_policy_tokens for g in groups for t in g)


async def sync_run(name: str, args: Any, update_s: float) -> Run:
    """Round-synchronous or the engine (eta = 0): roll a step out, then update."""
    tok, make_env, tasks, params = world(args)
    policy = VersionedSim(ScriptedPolicy(tok, scripted_turns(CALLS)), args.step_ms / 1000)
    sampler = IndependentSampler(GROUP, ROLLOUT)
    tokens, wait = 0, 0.0
    t0 = time.perf_counter()
    for step in range(args.steps):
        batch = tasks[step * args.tasks : (step + 1) * args.tasks]
        seeds = [derive_seed(args.seed, step, j) for j in range(args.tasks)]
        t1 = time.perf_counter()
        if name == "rounds":
            groups = await rounds_grpo(GROUP, policy, make_env, batch, params, seeds, ROLLOUT)
        else:
            groups = list(await asyncio.gather(*(sampler.sample(policy, make_env, t, params, s) for t, s in zip(batch, seeds))))
        wait += time.perf_counter() - t1
        tokens += tokens_of(groups)
        await asyncio.sleep(update_s)  # the update
        policy.load_weights([])
    wall = time.perf_counter() - t0
    return Run(name, wall, tokens, [0] * args.steps * args.tasks, 0, wait, wall - wait)


def async_run(eta: int, args: Any, update_s: float) -> Run:
    tok, make_env, tasks, params = world(args)
    policy = VersionedSim(ScriptedPolicy(tok, scripted_turns(CALLS)), args.step_ms / 1000)
    sampler = IndependentSampler(GROUP, ROLLOUT)
    loop = LoopThread("bench-rollout")
    cursor = [0]

    def draw() -> Any:
        cursor[0] += 1
        return tasks[(cursor[0] - 1) % len(tasks)]

    async def sample(p: Pending) -> Group:
        seed = derive_seed(args.seed, p.seq // args.tasks, p.seq % args.tasks, *((0, p.attempt) if p.attempt else ()))
        return await sampler.sample(policy, make_env, p.task, params, seed)

    run = Run(f"eta={eta}", 0.0, 0)
    t0 = time.perf_counter()
    source = SimpleNamespace(sample=sample, draw=draw, version=lambda: policy.weight_version)  # a `GroupSource`
    producer = AsyncRollout(loop, source, args.tasks, eta)
    try:
        for _ in range(args.steps):
            batch = producer.take()
            run.wait_s += batch.wait_s
            run.staleness += batch.staleness
            run.dropped += batch.dropped
            run.tokens += tokens_of(batch.groups)
            assert all(batch.version - group_versions(g, batch.version)[0] <= eta for g in batch.groups)
            time.sleep(update_s)  # the update, on this thread, while rollout goes on
            policy.load_weights([])
            producer.step_done()
        run.wall_s = time.perf_counter() - t0
        run.idle_s = producer.engine_idle_s() * run.wall_s / max(producer.elapsed_s(), 1e-9)
    finally:
        producer.close()

        async def stop_ticker() -> None:
            if policy._ticker is not None:
                policy._ticker.cancel()

        loop.run(stop_ticker())
        loop.stop()
    return run


def tiny(args: Any) -> None:
    import json
    import tempfile

    from agentenv.configs import load_config
    from agentenv.training.trainer import Trainer

    repo = Path(__file__).resolve().parents[1]
    print("| eta | steps | train wall s | steps/hour | staleness max | dropped | trainer waits | engines idle |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for eta in (0, 2):
        with tempfile.TemporaryDirectory() as out:
            overrides = [
                "policy.backend=hf", "env.tools=[search]", "env.tasks.kinds=[twohop]", f"trainer.steps={args.steps}",
                "trainer.tasks_per_step=2", "trainer.mini_batch_tasks=2", "algorithm.group_size=4",
                "trainer.eval_every=0", "trainer.eval_tasks=0", f"trainer.checkpoint_every={args.steps}",
                "logging.tensorboard=false", "logging.progress=false", f"trainer.output_dir={out}/run",
                f"trainer.max_staleness={eta}", f"algorithm.off_policy={'decoupled' if eta else 'none'}",
            ]  # fmt: skip
            trainer = Trainer(load_config(repo / "configs/toy_grpo.yaml", overrides))
            t0 = time.perf_counter()
            trainer.train()
            wall = time.perf_counter() - t0
            ms = [json.loads(line) for line in Path(out, "run", "metrics.jsonl").read_text().splitlines()]
            ms = [m for m in ms if "async/staleness_max" in m]
            last = ms[-1]
            print(f"| {eta} | {args.steps} | {wall:.1f} | {3600 * args.steps / wall:.0f} | "
                  f"{max(m['async/staleness_max'] for m in ms):.0f} | {last['async/dropped_total']:.0f} | "
                  f"{last['time/trainer_wait_frac']:.0%} | {last['time/engine_idle_frac']:.0%} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, faster steps (under 2 minutes)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=4, help="groups of 16 per step")
    ap.add_argument("--step-ms", type=float, default=10.0, help="one decode step of the simulated engine")
    ap.add_argument("--median-s", type=float, default=0.1, help="median tool latency")
    ap.add_argument("--etas", default="1,2,4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="the tiny model on CPU instead: steps per hour, eta 0 and 2")
    args = ap.parse_args()
    if args.tiny:
        tiny(args)
        return
    if args.quick:  # 2 groups of 16 a step, 5 steps, eta 1 and 2: under two minutes
        args.steps, args.tasks, args.step_ms, args.median_s, args.etas = 5, 2, 5.0, 0.05, "1,2"
    etas = [int(e) for e in args.etas.split(",")]

    # the update takes as long as the engine's rollout of one step: its mean over steps of their own, not timed
    calib = argparse.Namespace(**{**vars(args), "steps": 2, "seed": args.seed + 1000})
    update_s = asyncio.run(sync_run("engine", calib, 0.0)).wait_s / calib.steps
    print(f"groups of {GROUP}, {args.tasks} per step, {CALLS} tool calls per episode, lognormal latency median "
          f"{args.median_s:g} s (sigma 1), {args.step_ms:g} ms per decode step; simulated update {update_s:.2f} s "
          f"(= the engine's rollout of one step); {args.steps} steps")  # fmt: skip
    runs = [asyncio.run(sync_run("rounds", args, update_s)), asyncio.run(sync_run("engine", args, update_s))]
    runs[0].name, runs[1].name = "round-synchronous", "engine, eta=0"
    for eta in etas:
        runs.append(async_run(eta, args, update_s))
    base = runs[0].wall_s
    print("| loop | wall s | s/step | tokens/s | staleness mean / max | dropped groups | trainer waits | engines idle | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        st = f"{statistics.mean(r.staleness):.2f} / {max(r.staleness)}" if r.staleness else "-"
        print(f"| {r.name} | {r.wall_s:.2f} | {r.wall_s / args.steps:.2f} | {r.tokens / r.wall_s:.0f} | {st} | "
              f"{r.dropped} | {r.wait_s / r.wall_s:.0%} | {r.idle_s / r.wall_s:.0%} | {base / r.wall_s:.2f}x |")  # fmt: skip
    best = max(runs[2:], key=lambda r: base / r.wall_s) if runs[2:] else runs[1]
    print(f"best: {best.name}")
    print(f"speedup over round-synchronous: {base / best.wall_s:.2f}x")


if __name__ == "__main__":
    main()
