"""The hf backend on agent-shaped requests: kept caches (`policy.prefix_cache_mb`) against none, in one process.

Each of `--agents` agents runs `--turns` turns. A turn samples up to `--max-tokens` tokens; the next turn's prompt
is the last prompt, the reply and a `--result`-token tool result, as the env builds it. Both policies serve the
same model object; the repeats alternate between them (ABAB...), and the table gives the medians.

    python benchmarks/hf_turns.py [--model tiny|smollm2-135m|PATH] [--agents 8] [--turns 4] [--repeats 3]

Columns: wall seconds of all the turns; prompt tokens prefilled (computed, not read from a kept cache); the
decode steps' mean milliseconds (one token a row over the batch's cache; the same for both rows: the cache grows
in place either way).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time


def _agents(policy, prompts: list[list[int]], turns: int, max_tokens: int, result: list[int]) -> tuple[float, int]:
    """Wall seconds of every agent's turns, and the prompt tokens they sent in all."""
    from agentenv.types import SamplingParams

    async def agent(i: int, prompt: list[int]) -> int:
        ctx, sent = prompt, 0
        for t in range(turns):
            sent += len(ctx)
            g = await policy.generate(ctx, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * i + t))
            ctx = ctx + g.token_ids + result
        return sent

    async def everyone() -> int:
        return sum(await asyncio.gather(*(agent(i, p) for i, p in enumerate(prompts))))

    start = time.perf_counter()
    sent = asyncio.run(everyone())
    return time.perf_counter() - start, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="model name (tiny, smollm2-135m) or folder")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=300, help="tokens of each agent's first prompt")
    ap.add_argument("--result", type=int, default=40, help="tokens of each tool result")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentenv.policies.hf import HFPolicy, HFPolicyConfig
    from agentenv.policies.models import resolve_model_path

    path = str(resolve_model_path(args.model))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]
    prompts = [[rng.choice(vocab) for _ in range(args.prompt)] for _ in range(args.agents)]
    result = [rng.choice(vocab) for _ in range(args.result)]
    rows = {"kept caches (512 MiB)": 512, "none (prefix_cache_mb=0)": 0}
    seen: dict[str, list[tuple[float, int, float]]] = {name: [] for name in rows}  # wall, computed, decode ms
    for _ in range(args.repeats):
        for name, mb in rows.items():
            policy = HFPolicy(HFPolicyConfig(model=path, device="cpu", prefix_cache_mb=mb), model=model, tokenizer=tok)
            decode_s = []
            step = policy._decode

            def timed_decode(step=step, decode_s=decode_s):
                t = time.perf_counter()
                out = step()
                decode_s.append(time.perf_counter() - t)
                return out

            policy._decode = timed_decode
            wall, sent = _agents(policy, prompts, args.turns, args.max_tokens, result)
            seen[name].append((wall, sent - policy.stats.prefix_tokens, 1000 * statistics.mean(decode_s)))
    print(f"hf backend, {args.model}, {args.agents} agents x {args.turns} turns, first prompt {args.prompt} tokens, "
          f"tool results {args.result}, up to {args.max_tokens} tokens a turn, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}")  # fmt: skip
    print(f"{'':28} {'wall s':>8} {'prompt tokens prefilled':>24} {'decode step ms':>15}")
    for name, runs in seen.items():
        wall, computed, dec = (statistics.median(x) for x in zip(*runs))
        print(f"{name:28} {wall:8.2f} {computed:24.0f} {dec:15.1f}")


if __name__ == "__main__":
    main()
