"""The OpenAI-compatible endpoint's cost: requests per second and the latency it adds to each request.

1 and 32 concurrent agents (plain `openai.AsyncOpenAI` clients, one episode key each)
each send `--requests` chat completions in turn; the same prompts with the same
per-request seeds (so the same tokens are sampled) are sent to `policy.generate`
directly by as many concurrent callers, who render and tokenize them as the
endpoint does. Four paths, alternated `--rounds` times in this one process (a
loaded machine slows them alike), all over the same policy:

- `direct`: `policy.generate` called by the agents themselves;
- `before (REV), HTTP`: the endpoint as it was at `--before` (its server module
  from git), its clients on `openai.DefaultAsyncHttpxClient` over HTTP, as
  `AgentRunner` gave its agents before;
- `HTTP`: this endpoint over HTTP with the same clients (an agent in another
  process, or one given only the URL);
- `in-process`: this endpoint with the client `AgentRunner` gives its agents
  (`agent_http_client`: `LocalTransport`, no socket);
- `HTTP, agents in another process`: this endpoint over HTTP, its agents (the
  same clients, requests and seeds) in a process of their own, as agents given
  only the URL run (another program, another host); their process is started
  and its clients made before the clock starts.

The agents of the other paths run in this process and on its event loop, as `rollout.agent` does.
Reported: requests/s (median of the rounds) and its share of the direct path's
(median of the rounds' ratios), request latency p50/p95, and the latency the
endpoint adds, per request: the client's wall time minus the time its
`policy.generate` took inside the endpoint (the client, HTTP, JSON, rendering,
tokenizing, stitching, recording, and waiting for the shared loop). Goals: at
least 90% of the direct requests/s at 32 agents, under 5 ms added at p50 with one.

    python benchmarks/endpoint.py [--agents 32] [--requests 8] [--max-tokens 16] [--model tiny]
        [--backend hf|vllm|scripted] [--rounds 3] [--before main] [--profile]

`--backend scripted` answers every request at once with a fixed text (the tiny
model's tokenizer): the latency left is the endpoint's and the client's own.
`--profile` adds, per endpoint path, its CPU per request at `--agents` by whose
code ran it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import cProfile
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

OWNERS = [  # (path fragment, owner), first match wins
    ("/agentenv/rollout/endpoint/", "agentenv endpoint (handler, recorder)"),
    ("/agentenv/", "agentenv (other)"),
    ("/openai/", "openai client"),
    ("/httpx2/", "httpx2 (the client's requests)"),
    ("/pydantic", "openai client"),
    ("/httpx", "httpcore, h11, anyio (client connections)"),
    ("/httpcore", "httpcore, h11, anyio (client connections)"),
    ("/anyio/", "httpcore, h11, anyio (client connections)"),
    ("/h11/", "httpcore, h11, anyio (client connections)"),
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


def endpoint_at(rev: str) -> type:
    """The `Endpoint` class of the server module as it is at git revision `rev` (its recorder: this tree's)."""
    path = "agentenv/rollout/endpoint/server.py"
    src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    name = f"endpoint_server_at_{rev.replace('/', '_').replace('-', '_')}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))  # type: ignore[arg-type]  # a spec of a module made from source
    sys.modules[name] = module  # (dataclasses look their module up)
    exec(compile(src, f"<{rev}>/{path}", "exec"), module.__dict__)
    return module.Endpoint


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def messages(a: int, i: int) -> list[Any]:
    """Agent `a`'s request `i`."""
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": f"Question {a}.{i}: 17 + {a * 31 + i}?"}]


async def agent_walls(client: Any, a: int, requests: int, max_tokens: int) -> list[float]:
    """Agent `a`'s requests through `client` (an `openai.AsyncOpenAI`), one after another: each one's wall time."""
    walls = []
    for i in range(requests):
        t0 = time.perf_counter()
        await client.chat.completions.create(model="agentenv", messages=messages(a, i), max_tokens=max_tokens)
        walls.append(time.perf_counter() - t0)
    return walls


ELSEWHERE = object()  # the agents' client for the path whose agents run in another process


async def agents_elsewhere(url: str, keys: list[str], requests: int, max_tokens: int) -> tuple[float, list[list[float]]]:
    """One agent per episode key in a process of its own (`agents_process`), over HTTP: their elapsed seconds,
    from when every client is made, and each request's wall time, by agent."""
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--agents-process",
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps({"url": url, "keys": keys, "requests": requests, "max_tokens": max_tokens}).encode() + b"\n")
        await proc.stdin.drain()
        if (await proc.stdout.readline()).strip() != b"ready":
            raise RuntimeError("the agents' process did not start (its error is above)")
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        out = json.loads(await proc.stdout.readline())
    finally:
        if proc.returncode is None:
            proc.stdin.close()
            await proc.wait()
    return out["elapsed"], out["walls"]


def agents_process() -> None:
    """The agents of `agents_elsewhere`: reads their spec from stdin, says `ready`, waits for `go`, runs them,
    and writes their times to stdout."""
    import openai

    spec = json.loads(sys.stdin.readline())

    async def run() -> None:
        http = openai.DefaultAsyncHttpxClient()
        clients = [openai.AsyncOpenAI(base_url=spec["url"], api_key=k, max_retries=0, http_client=http) for k in spec["keys"]]
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        t0 = time.perf_counter()
        walls = await asyncio.gather(*(agent_walls(c, a, spec["requests"], spec["max_tokens"]) for a, c in enumerate(clients)))
        elapsed = time.perf_counter() - t0
        await http.aclose()
        print(json.dumps({"elapsed": elapsed, "walls": walls}), flush=True)

    asyncio.run(run())


GENERATE_S: contextvars.ContextVar[float] = contextvars.ContextVar("generate_s")  # the request's generate time, for its handler


class Timed:
    """The policy, with each `generate` call's wall time kept by its seed (unique per request)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.took: dict[int, float] = {}

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        t0 = time.perf_counter()
        gen = await self.policy.generate(prompt_ids, params)
        self.took[params.seed] = took = time.perf_counter() - t0
        GENERATE_S.set(took)  # (the handler awaits this coroutine in its own task: it reads the value back)
        return gen


def timed(base: type) -> Any:
    """`base` (an Endpoint class), with each chat request's time inside its handler, less its generate's, kept."""

    class TimedEndpoint(base):  # (a class chosen at run time)
        async def _chat(self, request: Any) -> Any:
            t0 = time.perf_counter()
            out = await super()._chat(request)
            self.handler.append(time.perf_counter() - t0 - GENERATE_S.get())
            return out

    return TimedEndpoint


async def main(args: argparse.Namespace) -> None:
    import openai

    from agentenv.envs.chat import ChatTemplate
    from agentenv.loader import build_dataclass
    from agentenv.policies.backends import build_policy
    from agentenv.policies.config import PolicyConfig
    from agentenv.policies.models import resolve_model_path
    from agentenv.rollout.endpoint.agent import agent_http_client
    from agentenv.rollout.endpoint.config import EndpointConfig
    from agentenv.rollout.endpoint.server import Endpoint
    from agentenv.rollout.engine import derive_seed
    from agentenv.types import SamplingParams

    path = resolve_model_path(args.model)
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

    # warm-up: the model's first batches
    await asyncio.gather(*(policy.generate(chat.encode(chat.render(messages(a, 0), add_generation_prompt=True)), params)
                           for a in range(args.agents)))  # fmt: skip

    # (an episode's cap, 64 requests, raised where --requests asks for more; main's EndpointConfig has no cap)
    cap = {"max_requests_per_episode": args.requests} if args.requests > 64 else {}
    before = await timed(endpoint_at(args.before))(chat, EndpointConfig(**cap), max_context_tokens=1024).start()
    after = await timed(Endpoint)(chat, EndpointConfig(**cap), max_context_tokens=1024).start()
    http = openai.DefaultAsyncHttpxClient()  # the clients' pool over HTTP (AgentRunner's before)
    local = agent_http_client(after)  # AgentRunner's now
    paths = {  # name -> (endpoint, the agents' httpx2 client)
        f"endpoint ({args.before}), HTTP": (before, http),
        "endpoint, HTTP": (after, http),
        "endpoint, in-process": (after, local),
        "endpoint, HTTP, agents in another process": (after, ELSEWHERE),
    }

    async def through(ep: Any, client_http: Any, agents: int) -> tuple[float, list[float], list[float], list[float]]:
        ep.handler = []
        policy.took.clear()
        if client_http is ELSEWHERE:
            recs = [ep.open_episode(policy, params, seed=a) for a in range(agents)]
            elapsed, walls = await agents_elsewhere(ep.url, [r.key for r in recs], args.requests, args.max_tokens)
            for r in recs:
                ep.close_episode(r.key)
        else:

            async def agent(a: int) -> list[float]:
                rec = ep.open_episode(policy, params, seed=a)
                client = openai.AsyncOpenAI(base_url=ep.url, api_key=rec.key, max_retries=0, http_client=client_http)
                walls = await agent_walls(client, a, args.requests, args.max_tokens)
                ep.close_episode(rec.key)
                return walls

            t0 = time.perf_counter()
            walls = await asyncio.gather(*(agent(a) for a in range(agents)))
            elapsed = time.perf_counter() - t0
        wall = [dt for ws in walls for dt in ws]
        added = [dt - policy.took[derive_seed(a, i)] for a, ws in enumerate(walls) for i, dt in enumerate(ws)]
        return elapsed, wall, added, ep.handler

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

    async def client_alone(k: int) -> float:
        """CPU per request of the openai client alone: `k` requests answered with a canned reply (no endpoint)."""
        import httpx2

        rec = after.open_episode(policy, params, seed=-1)
        reply = await local.post(after.url + "/chat/completions", headers={"Authorization": f"Bearer {rec.key}"},
                                 json={"model": "agentenv", "messages": messages(0, 0)})  # fmt: skip
        after.close_episode(rec.key)
        canned = httpx2.MockTransport(lambda request: httpx2.Response(200, headers=reply.headers, content=reply.content))
        async with httpx2.AsyncClient(transport=canned) as mock:
            client = openai.AsyncOpenAI(base_url=after.url, api_key=rec.key, max_retries=0, http_client=mock)
            c0 = time.process_time()
            for i in range(k):
                await client.chat.completions.create(model="agentenv", messages=messages(0, i), max_tokens=args.max_tokens)
            return (time.process_time() - c0) / k

    ms = 1000.0
    print(f"{args.model} model, {args.backend} backend (CPU), {args.requests} requests per agent, max_tokens {args.max_tokens}, "
          f"temperature 1.0, {args.rounds} rounds; latency in ms\n")  # fmt: skip
    print("| agents | path | requests/s | of direct | CPU per request | latency p50 | latency p95 | added p50 | added p95 "
          "| in-server p50 | in-server p95 |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    owners: dict[str, dict[str, float]] = {}
    for agents in sorted({1, args.agents}):
        n = agents * args.requests
        rate_d: list[float] = []
        lat_d: list[float] = []
        cpu_d: list[float] = []
        cpu: dict[str, list[float]] = {name: [] for name in paths}
        rate: dict[str, list[float]] = {name: [] for name in paths}
        ratio: dict[str, list[float]] = {name: [] for name in paths}
        wall: dict[str, list[float]] = {name: [] for name in paths}
        added: dict[str, list[float]] = {name: [] for name in paths}
        server: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(args.rounds):  # every path once a round: a loaded machine slows them alike
            c0 = time.process_time()  # the process's CPU, every thread's (the model's included)
            t_d, lat_r = await direct(agents)
            cpu_d.append((time.process_time() - c0) / n)
            rate_d.append(n / t_d)
            lat_d += lat_r
            for name, (ep, client_http) in paths.items():
                prof = cProfile.Profile() if args.profile and agents == args.agents and r == 0 else None
                if prof is not None:
                    prof.enable()
                c0 = time.process_time()
                t_e, wall_r, added_r, server_r = await through(ep, client_http, agents)
                cpu[name].append((time.process_time() - c0) / n)
                if prof is not None:
                    prof.disable()
                    owners[name] = cpu_by_owner(prof, n)
                rate[name].append(n / t_e)
                ratio[name].append(t_d / t_e)
                wall[name] += wall_r
                added[name] += added_r
                server[name] += server_r
        print(f"| {agents} | direct (policy.generate) | {statistics.median(rate_d):.1f} | | {statistics.median(cpu_d) * ms:.2f} "
              f"| {pct(lat_d, .5) * ms:.1f} | {pct(lat_d, .95) * ms:.1f} | | | | |")  # fmt: skip
        for name in paths:
            print(f"| {agents} | {name} | {statistics.median(rate[name]):.1f} | {statistics.median(ratio[name]):.0%} "
                  f"| {statistics.median(cpu[name]) * ms:.2f} "
                  f"| {pct(wall[name], .5) * ms:.1f} | {pct(wall[name], .95) * ms:.1f} | {pct(added[name], .5) * ms:.2f} "
                  f"| {pct(added[name], .95) * ms:.2f} | {pct(server[name], .5) * ms:.2f} "
                  f"| {pct(server[name], .95) * ms:.2f} |")  # fmt: skip
    alone = statistics.median([await client_alone(100) for _ in range(args.rounds)])
    print(f"\nThe openai client alone (a canned reply: no endpoint, no HTTP): {alone * ms:.2f} ms of CPU per request.")
    if args.profile:
        print(f"\nCPU per request at {args.agents} agents, by whose code ran it (cProfile, which slows everything "
              "alike; ms):\n")
        print("| code | " + " | ".join(owners) + " |")
        print("|---|" + "---:|" * len(owners))
        names = sorted({k for o in owners.values() for k in o}, key=lambda k: -max(o.get(k, 0.0) for o in owners.values()))
        for k in [*names, "total"]:
            cells = [sum(o.values()) if k == "total" else o.get(k, 0.0) for o in owners.values()]
            print(f"| {k} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print("\nof direct: the rounds' median of direct time / this path's time; CPU per request: this process's (every "
          "thread's: the model's, the agents' clients', the endpoint's; not the other process's agents'), median of "
          "the rounds; added: per request, the client's wall time minus its policy.generate time inside the endpoint; "
          "in-server: the handler's time minus its generate's (quantiles of each).")
    for ep in (before, after):
        await ep.aclose()
    await http.aclose()
    await local.close_pool()


if __name__ == "__main__":
    if sys.argv[1:] == ["--agents-process"]:  # (agents_elsewhere's child)
        agents_process()
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm", "scripted"])
    ap.add_argument("--rounds", type=int, default=3,
                    help="every path run once a round, this many rounds; requests/s and their ratios: medians")
    ap.add_argument("--before", default="main", help="the git revision whose endpoint is the 'before' row")
    ap.add_argument("--profile", action="store_true",
                    help="profile each endpoint path at --agents and print its CPU per request by whose code ran it")
    asyncio.run(main(ap.parse_args()))
