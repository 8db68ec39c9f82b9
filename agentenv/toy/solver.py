"""A scripted solver of the toy tasks, for cold-start SFT (`sft.solver: agentenv.toy.solver:solve`).

It writes a toy task's reference solution (`agentenv.toy.tasks.reference_turns`:
the calls and the answer) as the policy turns of the run's tool-call format:
hermes JSON calls (`{"name": "python", "arguments": {"code": "print(4821 * 917)"}}`,
the argument named by the tool's schema) or ARPO's tags. The env's real tools
answer the calls when the turns are replayed (`agentenv.training.sft_data`).

`estimate_share` answers that share of the arithmetic tasks without the tool,
with a two-significant-digit estimate (`agentenv.toy.tiny.traces.estimate_turns`:
well formed, wrong): a cold start that under-uses its tool, as the tiny model's
build does, so that RL has a choice to learn.

`per_kind` answers only the first N tasks of each kind (None for the rest): the
toy train split lists its kinds one after the other, so SFT's first examples
are then a mix of the kinds, not the first kind alone.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from agentenv.tasks.task import Task
from agentenv.tools.base import tool_schema
from agentenv.toy.tasks import reference_turns


def _argument(tool: Any) -> str:
    """The name of a tool's one argument (`query` for a tool without a schema)."""
    props = tool_schema(tool)["function"]["parameters"].get("properties") or {"query": {}}
    if len(props) != 1:
        raise ValueError(f"the toy solver calls tools of one argument; {tool.name} takes {', '.join(props)}")
    return next(iter(props))


def _lead(thought: str, think: bool, explain: bool) -> str:
    if not explain:
        return ""
    return f"<think>{thought}</think>\n" if think else f"{thought}\n"


def _estimated(task: Task, share: float) -> bool:
    return task.metadata.get("kind") == "arith" and zlib.crc32(task.id.encode()) % 1000 < share * 1000


def solve(
    task: Task, tools: Mapping[str, Any], tool_format: str, estimate_share: float = 0.0, think: bool = False,
    explain: bool = True, per_kind: int | None = None,
) -> list[str] | None:
    """The policy turns that solve a toy task in `tool_format`, or None (not a toy task, or a tool is missing).

    Args:
        task: A toy task.
        tools: The env's tools by name (the hermes calls name their arguments by the schemas).
        tool_format: `hermes` or `tags`.
        estimate_share: Share of arithmetic tasks answered by an estimate, without the tool.
        think: Open hermes turns with the reference's reasoning in `<think></think>`
            (else as a plain sentence).
        explain: Write that reasoning at all in hermes turns (False: the call or the answer alone, the
            shortest turns: "I will compute it with python." is 8 of SmolLM2's tokens).
        per_kind: Solve only the tasks whose index within their kind (`toy-<kind>-<split>-<index>`) is
            below this; None: every task.
    """
    from agentenv.toy.tiny.traces import estimate_turns

    solution = task.metadata.get("solution")
    if solution is None or any(s["tool"] not in tools for s in solution):
        return None
    if per_kind is not None and int(task.id.rsplit("-", 1)[1]) >= per_kind:
        return None
    if estimate_share and _estimated(task, estimate_share):
        try:
            turns = estimate_turns(task)
        except ValueError:
            turns = None  # a round result: solved with the tool
        if turns is not None:
            return turns if tool_format == "tags" else [t.replace("<think>", "").replace("</think>", " ") for t in turns]
    if tool_format == "tags":
        return reference_turns(task)
    if tool_format != "hermes":
        raise ValueError(f"the toy solver writes hermes or tags turns, not {tool_format!r}")
    thinks = task.metadata["thinks"]
    turns = []
    for th, step in zip(thinks, solution):
        call = {"name": step["tool"], "arguments": {_argument(tools[step["tool"]]): step["query"]}}
        turns.append(f"{_lead(th, think, explain)}<tool_call>\n{json.dumps(call)}\n</tool_call>")
    turns.append(f"{_lead(thinks[-1], think, explain)}<answer>\\boxed{{{task.ground_truth}}}</answer>")
    return turns
