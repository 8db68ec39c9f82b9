"""Cold-start SFT traces, token-exact with what the model sees at rollout.

Each trace is a real episode: the toy task's reference turns are played by a
`ScriptedPolicy` through the real `AgentEnv`, with the real BM25 search tool
over the toy corpus and, for python, `ReferencePythonTool` (the arithmetic of
the reference code, evaluated in process). The trace's tokens are the env's
context and its loss mask is the env's (1 exactly on policy tokens).

A share of the arithmetic tasks get an estimate trace instead (`estimate_turns`):
one turn that answers without the python tool, well formed and wrong. The
cold-start model then skips the tool on some arithmetic tasks when it samples,
as cold-start models under-use their tools; GRPO's groups on those tasks hold
both choices, and the reward tells them apart.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.tasks.task import Task
from agentenv.types import SamplingParams, ToolResult

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "abs"
        and len(node.args) == 1
        and not node.keywords
    ):
        return abs(_eval_int(node.args[0]))
    raise ValueError("only integer +, -, * and abs() are supported")


def eval_print_arithmetic(code: str) -> str:
    """Stdout of `print(<integer arithmetic>)` lines, evaluated without running code.

    Raises:
        ValueError: Anything beyond `print()` of integer `+ - *` and `abs()`.
    """
    out = []
    for stmt in ast.parse(code.strip(), mode="exec").body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"):
            raise ValueError("only print(...) statements are supported")
        out.append(" ".join(str(_eval_int(a)) for a in call.args) + "\n")
    return "".join(out)


class ReferencePythonTool:
    """The `python` tool for SFT traces and the build's evaluation: the toy tasks'
    arithmetic, evaluated in process (no sandbox needed).

    The text is the program's stdout without the trailing newline, as the
    sandbox tool reports a successful run. Anything else is an error result,
    as a failed run would be.
    """

    name = "python"

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        try:
            text = eval_print_arithmetic(query).rstrip("\n")
        except (ValueError, SyntaxError, RecursionError) as e:
            return ToolResult(
                text="", ok=False, error=f"{type(e).__name__}: {e}", latency_s=time.perf_counter() - t0, kind="agent"
            )
        return ToolResult(text=text, latency_s=time.perf_counter() - t0)

    def fork(self) -> ReferencePythonTool:
        return self

    async def aclose(self) -> None:
        return None


ESTIMATE_THINK = "I will estimate it in my head."
"""Opens an estimate trace's only turn; a tool trace of arithmetic opens with
"I will compute it with python.", so the choice is one token after "I will"."""


def estimate(value: int) -> int:
    """`value` rounded to two significant digits (what a head estimate gets right; ties to even)."""
    if abs(value) < 100:
        return value
    scale = 10 ** (len(str(abs(value))) - 2)
    return round(value / scale) * scale


def estimate_turns(task: Task) -> list[str]:
    """The one policy turn of an arithmetic task answered without the python tool.

    The answer is the result rounded to two significant digits: well formed,
    and wrong under the reward's exact match.

    Raises:
        ValueError: Not an arithmetic toy task, or the estimate is the exact result
            (a round result: the trace would teach that skipping the tool pays).
    """
    if task.metadata.get("kind") != "arith":
        raise ValueError(f"task {task.id}: estimate traces are for arithmetic tasks only")
    value = int(task.ground_truth)
    guess = estimate(value)
    if guess == value:
        raise ValueError(f"task {task.id}: the estimate {guess} is the exact result")
    return [f"<think>{ESTIMATE_THINK}</think><answer>\\boxed{{{guess}}}</answer>"]


@dataclass
class Trace:
    """One SFT example: the episode's tokens and the env's loss mask.

    `estimate` marks a trace that answers an arithmetic task without the tool
    (see `estimate_turns`): well formed and wrong.
    """

    task_id: str
    kind: str
    token_ids: list[int]
    loss_mask: list[int]
    estimate: bool = False

    def __len__(self) -> int:
        return len(self.token_ids)


def make_tools(corpus_path: str | Path, search_k: int) -> list[Any]:
    """The real BM25 search tool over the toy corpus and the reference python tool."""
    from agentenv.tools.search import LocalSearchTool

    return [LocalSearchTool.from_corpus(corpus_path, k=search_k), ReferencePythonTool()]


def make_env(tools: list[Any], tokenizer: Any, max_result_tokens: int, max_context_tokens: int) -> Any:
    """The traces' env: the default env class (`AgentEnv`), built like a run's."""
    from agentenv.envs.config import AgentEnvConfig
    from agentenv.envs.parts import EnvInputs, build_env

    cfg = AgentEnvConfig(max_result_tokens=max_result_tokens, max_context_tokens=max_context_tokens)
    spec = cfg.env_spec()
    return build_env(spec, EnvInputs(cfg, spec.options, tuple(tools), tokenizer, cfg.reward_fn()))


async def _trace_one(
    task: Task, tools: list[Any], tokenizer: Any, env_kw: dict[str, int], as_estimate: bool = False
) -> Trace | None:
    from agentenv.policies.scripted import ScriptedPolicy
    from agentenv.rollout import run_episode
    from agentenv.toy.tasks import reference_turns

    env = make_env(tools, tokenizer, **env_kw)
    if as_estimate:
        try:
            turns = estimate_turns(task)
        except ValueError:
            as_estimate = False  # a round result: this task gets a tool trace
    if not as_estimate:
        turns = reference_turns(task)
    policy = ScriptedPolicy(tokenizer, turns)
    traj = await run_episode(policy, env, task, SamplingParams(max_tokens=512, temperature=0.0), seed=0)
    if traj.failed or traj.finish_reason != "answer":
        return None
    if as_estimate:
        reward = traj.info.get("reward", {})
        if traj.num_tool_calls or traj.correct or not reward.get("format_ok", False):
            return None
        return Trace(task.id, task.metadata["kind"], traj.token_ids, traj.loss_mask, estimate=True)
    # Drop traces where a hop's expected value is not in what the tool returned.
    results = [tokenizer.decode(s.token_ids) for s in traj.segments if s.source == "tool"]
    try:
        reference_turns(task, results)
    except ValueError:
        return None
    if not traj.correct:
        return None
    return Trace(task.id, task.metadata["kind"], traj.token_ids, traj.loss_mask)


def pick_estimates(tasks: list[Task], share: float, seed: int) -> set[str]:
    """Ids of the arithmetic tasks (`share` of them, drawn with `seed`) whose traces skip the tool."""
    arith = [t.id for t in tasks if t.metadata.get("kind") == "arith"]
    return set(random.Random(f"estimates-{seed}").sample(arith, round(share * len(arith))))


async def make_traces_async(
    tasks: list[Task],
    tools: list[Any],
    tokenizer: Any,
    max_result_tokens: int,
    max_context_tokens: int,
    estimate_ids: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[Trace], int]:
    """Traces of `tasks` (those that pass the checks) and the number dropped.

    Tasks in `estimate_ids` get an estimate trace (`estimate_turns`) instead
    of a tool trace, unless their result is round.
    """
    env_kw = {"max_result_tokens": max_result_tokens, "max_context_tokens": max_context_tokens}
    sem = asyncio.Semaphore(64)

    async def one(t: Task) -> Trace | None:
        async with sem:
            return await _trace_one(t, tools, tokenizer, env_kw, as_estimate=t.id in estimate_ids)

    out = await asyncio.gather(*(one(t) for t in tasks))
    kept = [t for t in out if t is not None]
    return kept, len(out) - len(kept)
