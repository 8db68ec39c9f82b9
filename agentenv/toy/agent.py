"""A user's agent, written as for any OpenAI-compatible server: the example of `rollout.agent`.

    rollout:
      agent: agentenv.toy.agent:calculator_agent

It is a plain loop of chat completions with one tool, `calculate`, which the
agent runs itself; agentenv sees only the requests (configs/toy_agent_grpo.yaml,
docs/guides/own-agent.md). Nothing here imports agentenv or openai: the client
is given.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression (+, -, *, /, parentheses) and return its value.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}]  # fmt: skip

_OPS: dict[type, Callable[..., float]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}  # fmt: skip


def calculate(expression: str) -> str:
    """The agent's own tool: arithmetic only (no names, no calls), errors as text."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    try:
        value = ev(ast.parse(str(expression)[:200], mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
    return str(int(value) if float(value).is_integer() else value)


async def calculator_agent(client: Any, task: Any, model: str = "agentenv", max_turns: int = 3) -> str:
    """Answer `task` with the model behind `client`, running its `calculate` calls; returns the final answer text."""
    messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
    content = ""
    for _ in range(max_turns):
        resp = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        msg = resp.choices[0].message
        content = msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            try:
                args = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                args = {}
            expression = args.get("expression", "") if isinstance(args, dict) else ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return content


async def tiny_python_agent(client: Any, task: Any, model: str = "agentenv", max_calls: int = 3) -> str:
    """The same idea for the tiny model, which writes ARPO's tags: `<python>print(...)</python>` inside its turn.

    The agent stops each completion at `</python>` or `</answer>`, runs the
    printed expression with `calculate`, and continues the model's own turn
    with `<result>...</result>` appended (a prefill: the last message is the
    assistant's). Returns what the model wrote (not the results), which
    `env.reward` scores.
    """
    messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
    turn = ""  # the assistant turn so far, results included
    written: list[str] = []  # what the model wrote
    for _ in range(max_calls + 1):
        msgs = messages + ([{"role": "assistant", "content": turn}] if turn else [])
        resp = await client.chat.completions.create(model=model, messages=msgs, stop=["</python>", "</answer>"])
        part = resp.choices[0].message.content or ""
        written.append(part)
        turn += part
        if not part.endswith("</python>") or resp.choices[0].finish_reason == "length":
            break
        code = part.rsplit("<python>", 1)[-1].removesuffix("</python>").strip()
        expr = code[len("print(") : -1] if code.startswith("print(") and code.endswith(")") else code
        turn += f"<result>\n{calculate(expr)}\n</result>"
    return "".join(written)
