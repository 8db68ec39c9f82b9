"""What recording rollouts (`logging.save_rollouts`) costs the toy ARPO step, side by side with it off, in one process.

The trainer of configs/toy_arpo.yaml (the tiny model) rolls out one real step;
then the same step's groups are trained on again and again (the rollout
replaced by those groups, so every repeat does the same work) with the record
off and on, alternating (off, on, on, off, ...). Reported: the median step
time of each (advantages, recompute, update, weight push: everything but
sampling), their ratio, the time the hook takes on the trainer's thread (the
groups turned into plain lists), the time the writer thread spends encoding,
decoding and writing them (overlapping the next step), and the bytes per
recorded step; the real step's time, rollout included, gives the scale.

    python benchmarks/rollout_log.py [--repeats 6] [--tasks 8] [--groups 4] [--backend hf]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=6, help="steps timed per mode")
    ap.add_argument("--tasks", type=int, default=8, help="trainer.tasks_per_step (the toy's 8)")
    ap.add_argument("--groups", type=int, default=4, help="logging.rollouts_groups (the default 4; 0: every group)")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    args = ap.parse_args()

    from agentenv.configs import load_config
    from agentenv.training.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix="bench-rollout-log-"))
    cfg = load_config("configs/toy_arpo.yaml", [
        f"policy.backend={args.backend}", f"trainer.output_dir={out / 'run'}", "logging.progress=false",
        "logging.tensorboard=false", f"trainer.tasks_per_step={args.tasks}", f"trainer.mini_batch_tasks={max(1, args.tasks // 2)}",
        f"logging.rollouts_groups={args.groups}", "trainer.eval_every=0",
    ])  # fmt: skip
    trainer = Trainer(cfg)
    log = trainer.rollout_log
    assert log is not None
    hook_s: list[float] = []
    write_s: list[float] = []
    hook, write = log.train_step, log._write

    def timed_hook(*a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        hook(*a, **k)
        hook_s.append(time.perf_counter() - t0)

    def timed_write(*a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        write(*a, **k)
        write_s.append(time.perf_counter() - t0)

    log.train_step = timed_hook  # type: ignore[method-assign]
    log._write = timed_write  # type: ignore[method-assign]

    try:
        trainer.check_tools()
        sampled: list[Any] = []
        rollout = trainer.rollouts.groups

        async def capture(*a: Any, **k: Any) -> Any:
            groups = await rollout(*a, **k)
            sampled.append(groups)
            return groups

        trainer.rollouts.groups = capture  # type: ignore[method-assign]
        real = trainer.train_step(0)
        log.flush()
        n_traj = sum(len(g) for g in sampled[0])

        async def replay(*a: Any, **k: Any) -> Any:
            v = trainer.rt.policy.weight_version  # the groups as if sampled by the current weights (staleness 0)
            for g in sampled[0]:
                for t in g:
                    for seg in t.segments:
                        if seg.versions is not None:
                            seg.versions = [v] * len(seg)
            return sampled[0]

        trainer.rollouts.groups = replay  # type: ignore[method-assign]
        times: dict[str, list[float]] = {"off": [], "on": []}
        hook_s.clear()
        write_s.clear()
        order = [m for i in range(args.repeats) for m in (("off", "on") if i % 2 == 0 else ("on", "off"))]
        for step, mode in enumerate(order, start=1):
            trainer.rollout_log = log if mode == "on" else None
            t0 = time.perf_counter()
            trainer.train_step(step)
            times[mode].append(time.perf_counter() - t0)
            log.flush()  # the writer's work stays in its own step (it overlaps the next step's rollout in a run)
        trainer.rollout_log = log
        size = sum(f.stat().st_size for f in (out / "run" / "rollouts").glob("train_*.jsonl"))
        files = len(list((out / "run" / "rollouts").glob("train_*.jsonl")))
    finally:
        trainer.close()

    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"toy ARPO step ({args.backend}, {args.tasks} tasks x M=8 = {n_traj} trajectories; rollouts_groups={args.groups}); "
          f"the real step, rollout included: {real['time/step_s']:.2f} s (rollout {real['time/rollout_s']:.2f} s)")  # fmt: skip
    print(f"{'record':<8}{'median step s':>15}{'min':>9}{'max':>9}   (the same groups each step: no rollout)")
    for mode in ("off", "on"):
        ts = times[mode]
        print(f"{mode:<8}{statistics.median(ts):>15.3f}{min(ts):>9.3f}{max(ts):>9.3f}")
    print(f"on / off: {on / off:.4f} (median of {args.repeats} each, alternating)")
    print(f"hook on the trainer's thread: median {1e3 * statistics.median(hook_s):.1f} ms per step "
          f"= {100 * statistics.median(hook_s) / real['time/step_s']:.3f}% of the real step")  # fmt: skip
    print(f"writer thread (encode, decode, write): median {1e3 * statistics.median(write_s):.1f} ms per step, "
          f"overlapping the step; {size / max(files, 1) / 1e3:.0f} kB per recorded step")  # fmt: skip


if __name__ == "__main__":
    main()
