"""Python sandbox latency and throughput: the warm pool against one `docker exec` per call.

Usage: python benchmarks/sandbox.py [--n 200] [--n-heavy 60] [--concurrency 8] [--pool-size 8] [--n-container 5]

Side by side in one process, on the same image and the same container limits:
- warm pool, stateless: the runner (PID 1 of each container) forks a fresh
  process per call; requests and replies travel as JSON lines over the
  container's attach stream, which the pool holds open;
- warm pool, session: the same, each call a cell of a live session (forked
  from the session's head);
- `docker exec` per call: `python3 -c CODE` started by the Docker API inside a
  warm container for every call (what a pool without a runner would do);
- one container per episode: what isolating sessions by container would cost,
  a container started (runner warm-up included) for each episode, up to its
  first answer.

Prints a markdown table: p50/p95 latency of `print(1)` and of a small
numpy/sympy snippet, and calls per second with `--concurrency` calls in flight.
Needs a Docker daemon and the sandbox image (`agentenv sandbox build`).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from agentenv.tools.python_sandbox import PythonSandboxConfig, SandboxPool
from agentenv.tools.python_sandbox._docker import docker_client, require_image
from agentenv.tools.python_sandbox.pool import _owner_id

PRINT1 = "print(1)"
HEAVY = "import numpy as np, sympy as sp\nx = sp.Symbol('x')\nprint(np.linalg.det(np.eye(3) * 2), sp.factor(x**2 - 1))"
HEAVY_OUT = "7.999999999999998 (x - 1)*(x + 1)\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def latencies(call: Callable[[str], Awaitable[str]], code: str, n: int, expect: str) -> list[float]:
    out = await call(code)  # warm-up (first import, page cache)
    assert out == expect, f"unexpected output {out!r}"
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call(code)
        times.append(time.perf_counter() - t0)
    return times


class Timed:
    """Wraps a pool call; keeps the time each call spent inside the sandbox (runner side)."""

    def __init__(self, run: Callable[[str], Awaitable]):
        self.run = run
        self.inside: list[float] = []

    async def __call__(self, code: str) -> str:
        r = await self.run(code)
        self.inside.append(r.duration_s)
        return r.stdout


async def throughput(call: Callable[[str], Awaitable[str]], code: str, total: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await call(code)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


class ExecBaseline:
    """One `docker exec python3 -c CODE` per call in a warm container with the pool's limits."""

    def __init__(self, cfg: PythonSandboxConfig, threads: int):
        self.client = docker_client(cfg.docker_timeout_s)
        uid, gid = "65534", "65534"  # one unprivileged user, as a plain `docker exec` setup would run
        self.container = self.client.containers.run(
            cfg.image,
            ["sleep", "infinity"],
            detach=True,
            network_mode="none",
            mem_limit=cfg.memory_bytes,
            memswap_limit=cfg.memory_bytes,
            pids_limit=cfg.pids_limit,
            nano_cpus=int(cfg.cpus * 1e9),
            read_only=True,
            tmpfs={"/work": f"rw,size={cfg.workdir_size_mb}m,uid={uid},gid={gid}"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user=f"{uid}:{gid}",
            working_dir="/work",
            environment={"OPENBLAS_NUM_THREADS": "1", "HOME": "/work"},
            labels={cfg.label: "1", f"{cfg.label}.owner": _owner_id()},
        )
        self.pool = concurrent.futures.ThreadPoolExecutor(threads)

    async def __call__(self, code: str) -> str:
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(self.pool, lambda: self.container.exec_run(["python3", "-c", code]))
        return res.output.decode()

    def close(self) -> None:
        self.pool.shutdown()
        self.container.remove(force=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="sequential calls per latency row (print(1))")
    ap.add_argument("--n-heavy", type=int, default=60, help="sequential calls of the numpy/sympy snippet")
    ap.add_argument("--n-exec", type=int, default=40, help="sequential calls per docker-exec latency row")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--n-container", type=int, default=5, help="episodes timed with a container of their own")
    args = ap.parse_args()

    base = PythonSandboxConfig(pool_size=args.pool_size, timeout_s=30)
    require_image(docker_client(base.docker_timeout_s), base.image)
    stateless = SandboxPool(base)
    session_pool = SandboxPool(PythonSandboxConfig(pool_size=1, mode="session", timeout_s=30))
    exec_baseline = ExecBaseline(base, args.concurrency)
    rows = []
    try:
        t0 = time.perf_counter()
        await stateless.start()
        start_s = time.perf_counter() - t0
        await session_pool.start()
        session = await session_pool.open_session()

        pool_call = Timed(stateless.run)
        session_call = Timed(session.run)
        variants = [
            ("warm pool, stateless (attach stream)", pool_call, args.n, args.n_heavy),
            ("warm pool, session cell (attach stream)", session_call, args.n, args.n_heavy),
            ("`docker exec` per call", exec_baseline, args.n_exec, max(5, args.n_exec // 4)),
        ]
        for name, call, n, n_heavy in variants:
            light = await latencies(call, PRINT1, n, "1\n")
            inside = list(getattr(call, "inside", []))
            heavy = await latencies(call, HEAVY, n_heavy, HEAVY_OUT)
            total = max(4 * args.concurrency, n // 2) if call is not exec_baseline else 4 * args.concurrency
            tput = await throughput(call, PRINT1, total, args.concurrency)
            rows.append((name, light, heavy, tput, inside))

        # Fork of a live session (ARPO branching): fork + first call in the branch.
        fork_times = []
        await session.run("import numpy as np\ndata = np.arange(100_000)")
        for _ in range(20):
            t0 = time.perf_counter()
            branch = session.fork()
            r = await branch.run("print(data[-1])")
            fork_times.append(time.perf_counter() - t0)
            assert r.stdout == "99999\n", r
            await branch.aclose()

        # One container per episode: start, open a session, first answer.
        own_container = []
        for _ in range(args.n_container):
            t0 = time.perf_counter()
            own = SandboxPool(PythonSandboxConfig(pool_size=1, mode="session", timeout_s=30))
            try:
                await own.start()
                first = await (await own.open_session()).run(PRINT1)
                own_container.append(time.perf_counter() - t0)
                assert first.stdout == "1\n", first
            finally:
                await own.aclose()
    finally:
        await stateless.aclose()
        await session_pool.aclose()
        exec_baseline.close()

    ms = lambda s: f"{1000 * s:.1f}"  # noqa: E731
    print(f"Python sandbox, {args.pool_size} warm containers (started in {start_s:.1f} s), "
          f"{args.concurrency} calls in flight for throughput; image {base.image}\n")  # fmt: skip
    print("| variant | print(1) p50 ms | print(1) p95 ms | of which in the sandbox, p50 ms | numpy+sympy p50 ms "
          f"| numpy+sympy p95 ms | print(1) calls/s, {args.concurrency} in flight |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, light, heavy, tput, inside in rows:
        inner = ms(statistics.median(inside)) if inside else "-"
        print(f"| {name} | {ms(statistics.median(light))} | {ms(pct(light, 0.95))} | {inner} | "
              f"{ms(statistics.median(heavy))} | {ms(pct(heavy, 0.95))} | {tput:.0f} |")  # fmt: skip
    print(f"\nsession fork + first call in the branch: p50 {ms(statistics.median(fork_times))} ms, "
          f"p95 {ms(pct(fork_times, 0.95))} ms")  # fmt: skip
    if own_container:
        print(f"one container per episode (start + session + first print(1)): p50 "
              f"{ms(statistics.median(own_container))} ms over {len(own_container)} episodes")  # fmt: skip
    speedup = statistics.median(rows[2][1]) / statistics.median(rows[0][1])
    load = os.getloadavg()[0]
    print(f"print(1) p50: the warm pool is {speedup:.0f}x faster than one docker exec per call "
          f"(host: {os.cpu_count()} CPUs, load average {load:.1f} at the end)")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
