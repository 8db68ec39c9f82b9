"""The OpenAI-compatible endpoint's cost: requests per second and the latency it adds to each request.

32 concurrent agents (plain `openai.AsyncOpenAI` clients, one episode key each)
each send `--requests` chat completions in turn to the endpoint over the tiny
model (hf backend, or vllm); the same prompts, with the same per-request seeds (so the
same tokens are sampled), are then sent to `policy.generate` directly by 32
concurrent callers, the two alternated `--rounds` times (a loaded machine slows
both alike). Reported: requests/s (median of the rounds) and their ratio (median
of the rounds' ratios), request latency p50/p95 of both,
and the latency the endpoint adds per request, measured per request as the
client's wall time minus the time its `policy.generate` call took inside the
endpoint (HTTP, JSON, the openai client's parsing, rendering the messages,
tokenizing, stitching and recording). The goal: under 5 ms at p50.

    python benchmarks/endpoint.py [--agents 32] [--requests 8] [--max-tokens 16] [--model tiny]
        [--backend hf|vllm|scripted] [--client openai|httpx] [--rounds 3] [--profile]

`--backend scripted` answers every request at once with a fixed text (the tiny
model's tokenizer): the latency left is the endpoint's and the client's own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import time
from typing import Any

OWNERS = [  # (path fragment, owner), first match wins
    ("/agentenv/rollout/endpoint/", "agentenv endpoint (handler, recorder)"),
    ("/agentenv/", "agentenv (other)"),
    ("/openai/", "openai client"),
    ("/pydantic", "openai client"),
    ("/httpx", "httpx (client HTTP)"),
    ("/httpcore", "httpx (client HTTP)"),
    ("/anyio/", "httpx (client HTTP)"),
    ("/h11/", "httpx (client HTTP)"),
    ("/aiohttp/", "aiohttp (server HTTP)"),
    ("/multidict/", "aiohttp (server HTTP)"),
    ("/yarl/", "aiohttp (server HTTP)"),
    ("/jinja2/", "chat template (jinja2)"),
    ("/transformers/", "tokenizer (transformers)"),
    ("/tokenizers/", "tokenizer (transformers)"),
    ("/asyncio/", "asyncio event loop"),
    ("/selectors.py", "asyncio event loop"),
    ("/json/", "json"),
    ("/typing.py", "openai client"),  # its request transform walks the typed dicts' hints
    ("/numpy/", "agentenv (other)"),  # derive_seed's SeedSequence
]


def cpu_by_owner(prof: Any, n_requests: int) -> dict[str, float]:
    """A profile's own time (tottime), summed by the code that ran it, in ms per request."""
    import pstats

    out: dict[str, float] = {}
    for (path, _, _), row in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]  # pstats' table
        owner = next((o for frag, o in OWNERS if frag in path), None)
        if owner is None:
            owner = "built-ins (C: sockets, str, dict...)" if path == "~" else "other Python"
        out[owner] = out.get(owner, 0.0) + row[2] * 1000.0 / n_requests
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Timed:
    """The policy, with each `generate` call's wall time kept by its seed (unique per request)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.took: dict[int, float] = {}

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        t0 = time.perf_counter()
        gen = await self.policy.generate(prompt_ids, params)
        self.took[params.seed] = time.perf_counter() - t0
        return gen


async def main(args: argparse.Namespace) -> None:
    import openai

    from agentenv.envs.chat import ChatTemplate
    from agentenv.policies.backends import build_policy
    from agentenv.policies.config import PolicyConfig
    from agentenv.policies.models import resolve_model_path
    from agentenv.rollout.endpoint.config import EndpointConfig
    from agentenv.rollout.endpoint.server import Endpoint
    from agentenv.rollout.engine import derive_seed
    from agentenv.types import SamplingParams

    path = resolve_model_path(args.model)
    from agentenv.loader import build_dataclass

    vllm = {"gpu_memory_utilization": 0.15, "max_model_len": 2048, "enforce_eager": True}  # configs/toy_grpo.yaml's
    pc = build_dataclass(PolicyConfig, {"backend": "hf" if args.backend == "scripted" else args.backend, "vllm": vllm}, "policy")
    if args.backend == "scripted":  # answers at once: what remains is the endpoint's and the client's own cost
        from agentenv.policies.models import load_tokenizer
        from agentenv.policies.scripted import ScriptedPolicy

        policy: Any = Timed(ScriptedPolicy(load_tokenizer(path), lambda ids: "The answer is 42, I think."))
    else:
        cfg = pc.backend_configs(model=args.model, dtype="float32", seed=0)[args.backend]
        policy = Timed(build_policy(args.backend, cfg, path))
    chat = ChatTemplate.from_config(policy.tokenizer, "chatml_hermes", {})
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    def messages(a: int, i: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": f"Question {a}.{i}: 17 + {a * 31 + i}?"}]

    # warm-up: the model's first batches
    await asyncio.gather(*(policy.generate(chat.encode(chat.render(messages(a, 0), add_generation_prompt=True)), params)
                           for a in range(args.agents)))  # fmt: skip

    class TimedEndpoint(Endpoint):
        """The endpoint, with each chat request's time inside its handler kept (by seed, as the policy's)."""

        handler: list[float] = []

        async def _chat(self, request: Any) -> Any:
            t0 = time.perf_counter()
            out = await super()._chat(request)
            self.handler.append(time.perf_counter() - t0)
            return out

    # (an episode's cap, 64 requests, raised where --requests asks for more; main's EndpointConfig has no cap)
    cap = {"max_requests_per_episode": args.requests} if args.requests > 64 else {}
    ep = await TimedEndpoint(chat, EndpointConfig(**cap), max_context_tokens=1024).start()
    http = openai.DefaultAsyncHttpxClient()

    async def through_endpoint(agents: int) -> tuple[float, list[float], list[float], list[float]]:
        wall: list[float] = []
        added: list[float] = []
        TimedEndpoint.handler = []
        policy.took.clear()

        async def agent(a: int) -> None:
            rec = ep.open_episode(policy, params, seed=a)
            client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0, http_client=http)
            auth = {"Authorization": f"Bearer {rec.key}"}
            for i in range(args.requests):
                t0 = time.perf_counter()
                if args.client == "openai":
                    await client.chat.completions.create(model="agentenv", messages=messages(a, i), max_tokens=args.max_tokens)
                else:  # the bare HTTP request: what the endpoint costs without the openai client's own work
                    r = await http.post(ep.url + "/chat/completions", headers=auth, json={
                        "model": "agentenv", "messages": messages(a, i), "max_tokens": args.max_tokens})  # fmt: skip
                    r.raise_for_status()
                    r.json()
                dt = time.perf_counter() - t0
                wall.append(dt)
                added.append(dt - policy.took[derive_seed(a, i)])
            ep.close_episode(rec.key)

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(a) for a in range(agents)))
        inside = sorted(policy.took.values())
        server = [h - g for h, g in zip(sorted(TimedEndpoint.handler), inside)]  # quantiles only: a sorted pairing
        return time.perf_counter() - t0, wall, added, server

    async def direct(agents: int) -> tuple[float, list[float]]:
        lat: list[float] = []

        async def caller(a: int) -> None:
            for i in range(args.requests):
                ids = chat.encode(chat.render(messages(a, i), add_generation_prompt=True))
                p = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=derive_seed(a, i))
                t0 = time.perf_counter()
                await policy.policy.generate(ids, p)
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(a) for a in range(agents)))
        return time.perf_counter() - t0, lat

    ms = 1000.0
    print(f"{args.model} model, {args.backend} backend (CPU), {args.requests} requests per agent, max_tokens {args.max_tokens}, "
          "temperature 1.0; latency in ms\n")  # fmt: skip
    print("| agents | path | requests/s | latency p50 | latency p95 | added p50 | added p95 | in-server p50 "
          "| in-server p95 | endpoint / direct |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    owners: dict[str, float] = {}
    for agents in sorted({1, args.agents}):
        n = agents * args.requests
        rate_d: list[float] = []
        rate_e: list[float] = []
        lat: list[float] = []
        wall: list[float] = []
        added: list[float] = []
        server: list[float] = []
        for r in range(args.rounds):  # direct and endpoint alternate: a loaded machine slows both alike
            t_d, lat_r = await direct(agents)
            prof = cProfile.Profile() if args.profile and agents == args.agents and r == 0 else None
            if prof is not None:
                prof.enable()
            t_e, wall_r, added_r, server_r = await through_endpoint(agents)
            if prof is not None:
                prof.disable()
                owners = cpu_by_owner(prof, n)
            rate_d.append(n / t_d)
            rate_e.append(n / t_e)
            lat += lat_r
            wall += wall_r
            added += added_r
            server += server_r
        ratio = statistics.median(e / d for e, d in zip(rate_e, rate_d))
        print(f"| {agents} | policy.generate, direct | {statistics.median(rate_d):.1f} | {pct(lat, .5) * ms:.1f} "
              f"| {pct(lat, .95) * ms:.1f} | | | | | |")  # fmt: skip
        print(f"| {agents} | endpoint + {args.client} client | {statistics.median(rate_e):.1f} | {pct(wall, .5) * ms:.1f} "
              f"| {pct(wall, .95) * ms:.1f} | {pct(added, .5) * ms:.2f} | {pct(added, .95) * ms:.2f} "
              f"| {pct(server, .5) * ms:.2f} | {pct(server, .95) * ms:.2f} | {ratio:.0%} |")  # fmt: skip
    if args.profile:
        print(f"\nCPU per request through the endpoint at {args.agents} agents, by whose code ran it (cProfile, "
              "which slows everything alike; ms):\n")
        print("| code | ms per request | share |")
        print("|---|---:|---:|")
        total = sum(owners.values())
        for name, cost in sorted(owners.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {cost:.2f} | {cost / total:.0%} |")
    print("\nadded: per request, the client's wall time minus its policy.generate time inside the endpoint (HTTP, "
          "JSON, the openai client, rendering, tokenizing, recording, and waiting for the shared event loop); "
          "in-server: the handler's time minus generate's (quantiles of each).")
    await ep.aclose()
    await http.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm", "scripted"])
    ap.add_argument("--client", default="openai", choices=["openai", "httpx"],
                    help="httpx: bare HTTP requests instead of the openai client")
    ap.add_argument("--rounds", type=int, default=3,
                    help="direct and endpoint runs alternated this many times; requests/s and their ratio: medians")
    ap.add_argument("--profile", action="store_true",
                    help="profile the endpoint phase at --agents and print its CPU per request by whose code ran it")
    asyncio.run(main(ap.parse_args()))
