"""Agents written as a user writes them: the plain `openai` client, tools run by the agent itself.

`rollout.agent: endpoint_agents:<name>` (this folder is on the test's sys.path).
Each agent logs its conversation (the messages it sent, and each answer's
token ids) under the trajectory the endpoint says it recorded, so a test can
rebuild the conversation from scratch.
"""

from __future__ import annotations

import json
from typing import Any

LOG: dict[str, list[dict[str, Any]]] = {}  # trajectory uid -> [{"messages": [...], "token_ids": [...], "content": ...}]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}]  # fmt: skip


def add(a: Any = 0, b: Any = 0) -> str:
    """The agent's own tool: it runs here, in the agent, not in agentenv."""
    try:
        return str(int(a) + int(b))
    except (TypeError, ValueError):
        return "error: a and b must be integers"


def _log(resp: Any, messages: list[dict[str, Any]]) -> None:
    extra = resp.model_extra["agentenv"]
    choice = resp.choices[0]
    LOG.setdefault(extra["trajectory"], []).append(
        {"messages": [dict(m) for m in messages], "token_ids": list(choice.model_extra["token_ids"]),
         "content": choice.message.content}  # fmt: skip
    )


async def calc_agent(client: Any, task: Any) -> str:
    """A loop of chat completions with one tool (`add`): at most 3 requests, then the last answer.

    A turn without a tool call gets one nudge ("Answer now."), so every
    conversation has at least two requests.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You can add numbers with the add tool."},
                                      {"role": "user", "content": task.question}]  # fmt: skip
    nudged = False
    content = ""
    for _ in range(3):
        resp = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS, max_tokens=24,
                                                    logprobs=True)  # fmt: skip
        _log(resp, messages)
        msg = resp.choices[0].message
        content = msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            for call in msg.tool_calls:
                try:
                    args = json.loads(call.function.arguments)
                except json.JSONDecodeError:
                    args = {}
                out = add(**args) if isinstance(args, dict) else add()
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
        elif not nudged:
            nudged = True
            messages.append({"role": "user", "content": "Answer now."})
        else:
            break
    return content


async def graded_calc_agent(client: Any, task: Any) -> float:
    """`calc_agent`, returning its own reward: the share of the reference's characters in the answer."""
    answer = await calc_agent(client, task)
    ref = str(task.ground_truth)
    return sum(ch in answer for ch in ref) / max(1, len(ref))


async def subcall_agent(client: Any, task: Any) -> str:
    """The main conversation, then an unrelated sub-call (a fresh conversation: a sub-agent)."""
    messages = [{"role": "user", "content": task.question}]
    first = await client.chat.completions.create(model="agentenv", messages=messages, tools=TOOLS)
    _log(first, messages)
    sub = [{"role": "user", "content": "Summarize: " + (first.choices[0].message.content or "")}]
    second = await client.chat.completions.create(model="agentenv", messages=sub)
    _log(second, sub)
    return second.choices[0].message.content or ""


async def closing_agent(client: Any, task: Any) -> str:
    """Closes its client when done, as `async with client:` does."""
    async with client:
        resp = await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    return resp.choices[0].message.content or ""


async def no_request_agent(client: Any, task: Any) -> str:
    return "nothing asked"


async def failing_agent(client: Any, task: Any) -> str:
    await client.chat.completions.create(model="agentenv", messages=[{"role": "user", "content": task.question}])
    raise RuntimeError("the agent's own bug")


def not_async(client: Any, task: Any) -> str:
    return ""
