"""SFT conversations -> trajectories, through the env the RL rollout uses.

A conversation is replayed, not re-rendered: a `ScriptedPolicy` plays its
assistant turns through the run's `AgentEnv` (the same tools' schemas, tool-call
format and chat template as RL), and each call is answered by the conversation's
recorded `tool` message (`RecordedTool`) or, for a scripted solver's turns, by
the real tool. The result is a `Trajectory`: its tokens are the context an RL
episode would hold, and its loss mask is the env's (1 exactly on the policy's
tokens), so SFT trains the tokens RL trains and nothing else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentenv.envs.hermes import CALL_CLOSE, CALL_OPEN
from agentenv.errors import ConfigError
from agentenv.tasks.task import Task
from agentenv.tools.base import tool_schema
from agentenv.types import SamplingParams, Tokenizer, ToolResult, Trajectory


@dataclass(frozen=True)
class Conversation:
    """One SFT example before replay.

    Attributes:
        task: The prompt (system and user messages) and, where known, the answer.
        turns: The assistant turns' texts, each ending where the policy stops
            (a call's closing tag, `</answer>`).
        results: The tool results in call order (None: the env's real tools answer).
    """

    task: Task
    turns: tuple[str, ...]
    results: tuple[str, ...] | None = None


@dataclass
class SFTExamples:
    """Replayed conversations and the ones dropped, with why (counts by reason)."""

    trajectories: list[Trajectory]
    dropped: dict[str, int] = field(default_factory=dict)


class RecordedTool:
    """A tool that answers with the recorded results in order, under another tool's name and schema."""

    def __init__(self, like: Any, results: list[str]):
        self.name = like.name
        schema = tool_schema(like)["function"]
        self.description = schema["description"]
        self.schema = schema["parameters"]
        self._results = results

    async def __call__(self, query: str) -> ToolResult:
        if not self._results:
            return ToolResult(text="", ok=False, error="no recorded result left", kind="agent")
        return ToolResult(text=self._results.pop(0))

    def fork(self) -> RecordedTool:
        return self  # one episode per conversation: its results are consumed in order

    async def aclose(self) -> None:
        return None


# --------------------------------------------------------------------------- reading files
def _call_text(call: Mapping[str, Any]) -> str:
    """An OpenAI-style `tool_calls` entry as the hermes text of the call."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args)
    return f"{CALL_OPEN}\n{json.dumps({'name': fn['name'], 'arguments': args})}\n{CALL_CLOSE}"


def conversation_from_messages(messages: Sequence[Mapping[str, Any]], cid: str, ground_truth: str = "") -> Conversation:
    """A chat conversation (system/user, then assistant turns and `tool` results) as a `Conversation`.

    An assistant message's calls are in its content (`<tool_call>...</tool_call>`)
    or in OpenAI-style `tool_calls` (written as hermes calls after the content).

    Raises:
        ValueError: No assistant turn, or a message after the first assistant turn that is neither
            an assistant turn nor a tool result.
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ValueError(f"conversation {cid}: needs a prompt, then assistant turns")
    prompt = tuple({"role": m["role"], "content": m.get("content") or ""} for m in messages[:first])
    turns: list[str] = []
    results: list[str] = []
    for m in messages[first:]:
        role = m.get("role")
        if role == "assistant":
            text = m.get("content") or ""
            calls = m.get("tool_calls") or []
            text += "".join(("\n" if text else "") + _call_text(c) for c in calls)
            turns.append(text)
        elif role == "tool":
            results.append(str(m.get("content") or ""))
        else:
            raise ValueError(f"conversation {cid}: a {role!r} message after the first assistant turn")
    return Conversation(Task(cid, prompt, str(ground_truth)), tuple(turns), tuple(results))


def read_conversations(path: str | Path, limit: int) -> list[Conversation]:
    """The first `limit` conversations of a JSONL or parquet file (a `messages` list per record).

    Raises:
        ConfigError: (`sft.data`) the file is missing or a record is not a conversation.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError("sft.data", f"{str(path)!r} does not exist")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(p).slice(0, limit).to_pylist()
    else:
        records = []
        with p.open() as f:
            for line in f:
                if line.strip():
                    records.append(json.loads(line))
                if len(records) >= limit:
                    break
    out = []
    for i, rec in enumerate(records):
        try:
            msgs = rec["messages"]
            out.append(conversation_from_messages(msgs, str(rec.get("id", f"sft-{i:06d}")), rec.get("ground_truth", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError("sft.data", f"{p} record {i + 1} is not a conversation: {e}") from None
    return out


def solve_tasks(
    solver: Callable[..., Sequence[str] | None], tasks: Sequence[Task], tools: Mapping[str, Any], tool_format: str,
    options: Mapping[str, Any], limit: int,
) -> list[Conversation]:
    """Conversations of a scripted solver over `tasks` (its calls answered by the real tools at replay)."""
    out = []
    for task in tasks:
        turns = solver(task, tools, tool_format, **options)
        if turns:
            out.append(Conversation(task, tuple(turns)))
        if len(out) >= limit:
            break
    return out


# --------------------------------------------------------------------------- replay
async def replay(
    conversation: Conversation, make_env: Callable[[Sequence[Any]], Any], tools: Mapping[str, Any],
    tokenizer: Tokenizer, params: SamplingParams,
) -> Trajectory:
    """Play a conversation's turns through a fresh env (`make_env(prototype_tools)`): the RL trajectory it is."""
    from agentenv.policies.scripted import ScriptedPolicy
    from agentenv.rollout import run_episode

    if conversation.results is None:
        prototypes: list[Any] = list(tools.values())
    else:
        recorded = list(conversation.results)
        prototypes = [RecordedTool(t, recorded) for t in tools.values()]  # one queue: results in call order
    env = make_env(prototypes)
    policy = ScriptedPolicy(tokenizer, list(conversation.turns))
    return await run_episode(policy, env, conversation.task, params, seed=0)


def why_dropped(conversation: Conversation, traj: Trajectory, tokenizer: Tokenizer, require_correct: bool) -> str | None:
    """Why a replayed conversation is no SFT example, or None when it is one.

    An example ends with an answer or EOS, its calls all went through, its policy
    tokens are exactly its turns (none cut at `policy.max_turn_tokens` or by the
    context). With `require_correct` (a solver's), one that calls a tool must be
    judged correct by the reward (a misread result would teach a wrong step), and
    one that calls none must be well formed (it is kept as written, right or
    wrong: a solver may answer without the tool on purpose).
    """
    if traj.failed:
        return f"failed: {traj.error}"
    if traj.finish_reason not in ("answer", "eos"):
        return f"ended by {traj.finish_reason}"
    if sum(sum(v.values()) for v in traj.tool_errors.values()) or traj.tool_calls.get("invalid"):
        return "a tool call failed"
    played = [tokenizer.decode(s.token_ids, skip_special_tokens=False) for s in traj.segments if s.source == "policy"]
    eos = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else None
    played = [t[: -len(eos)] if eos and t.endswith(eos) and not turn.endswith(eos) else t
              for t, turn in zip(played, conversation.turns)]  # fmt: skip
    if played != list(conversation.turns):
        return "the env did not play the turns as written"
    if require_correct and traj.num_tool_calls and not traj.correct:
        return "not correct"
    if require_correct and not traj.num_tool_calls and not traj.info.get("reward", {}).get("format_ok", False):
        return "not well formed"
    return None


async def replay_all(
    conversations: Sequence[Conversation], make_env: Callable[[Sequence[Any]], Any], tools: Mapping[str, Any],
    tokenizer: Tokenizer, params: SamplingParams, require_correct: bool, concurrency: int = 16,
) -> SFTExamples:
    """Replay every conversation; keep the ones that are SFT examples (`why_dropped`)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Conversation) -> Trajectory:
        async with sem:
            return await replay(c, make_env, tools, tokenizer, params)

    trajs = await asyncio.gather(*(one(c) for c in conversations))
    out = SFTExamples([])
    for c, t in zip(conversations, trajs):
        why = why_dropped(c, t, tokenizer, require_correct)
        if why is None:
            out.trajectories.append(t)
        else:
            key = why.split(":")[0]
            out.dropped[key] = out.dropped.get(key, 0) + 1
    return out
