"""One episode's requests, recorded as token-exact trajectories stitched by prefix.

A request's messages are rendered with the run's chat template. Each assistant
message that this episode's endpoint produced (recognized by the tool-call ids
it issued, or by its content and calls) is rendered as the exact text the
policy wrote, so the template reproduces the policy's own turn; one that keeps
an issued id but not the content or calls answered is an edit, rendered as
sent. Then:

- the rendering extends the text of a trajectory recorded so far (its prompt,
  completions and the tokens between them): the request continues it. Only the
  new text at the end is tokenized (alone), as the tool or user turn between two
  completions, outside the loss; the recorded ids are kept as they are, so the
  policy's tokens are never re-tokenized;
- otherwise it starts a new trajectory of the same episode (a sub-agent, an
  unrelated call), whose prompt is the rendering tokenized. When such a request
  carries an assistant message this episode produced (or an edit of one), the agent rewrote the
  conversation (dropped or edited a turn) or the template does not render
  earlier turns verbatim: the request is counted as a prefix break
  (`rollout/prefix_breaks`).

Two requests in flight on one trajectory at once (parallel branches of an
agent) both match it; the first answer extends it, the second starts a new
trajectory whose prompt is the same exact ids (`parent_uid` and `branch_token`
say where it branched off).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentenv.envs.chat import ChatTemplate
from agentenv.errors import ConfigError
from agentenv.policies.base import Policy
from agentenv.types import Generation, SamplingParams, Segment, Tokenizer, Trajectory, _new_uid

ROLES = ("system", "developer", "user", "assistant", "tool")
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class RequestError(Exception):
    """A request the endpoint refuses; becomes an OpenAI-style error body.

    Attributes:
        status: HTTP status.
        code: OpenAI's `error.code` (`invalid_request_error` family).
        param: The request field at fault, if any.
    """

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 type_: str = "invalid_request_error"):  # fmt: skip
        super().__init__(message)
        self.status, self.code, self.param, self.type = status, code, param, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def content_text(content: Any, param: str) -> str | None:
    """A message's content as text: a string, None, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise RequestError(400, f"{param}[{i}]: only text content parts are supported", "invalid_content", param)
        return "".join(parts)
    raise RequestError(400, f"{param} must be a string or a list of text parts", "invalid_content", param)


def _norm_args(args: Any) -> str:
    """Arguments of a call, normalized for comparison (a JSON string, or an object)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return cast(str, args)  # still the text: json.loads failed
    return json.dumps(args, sort_keys=True, ensure_ascii=False)


def _call_key(content: str | None, calls: Sequence[tuple[str, Any]]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ((content or "").strip(), tuple((n, _norm_args(a)) for n, a in calls))


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) of a completion in the hermes format: `<tool_call>{"name", "arguments"}</tool_call>` blocks.

    A block that is not a JSON call of a tool the request offered stays in the
    content, where the agent can read it (as an OpenAI server would answer).
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in tool_names:
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        kept.append(text[pos : m.start()])
        pos = m.end()
        calls.append({
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
        })  # fmt: skip
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def longest_token_chars(tokenizer: Tokenizer) -> int:
    """The most characters of text one token stands for (its longest vocabulary entry; at least 1).

    A byte-level entry is as long as its bytes, a text is at least as long in
    bytes as in characters, and added tokens are in the vocabulary: so a text of
    c characters is at least c / this many tokens.
    """
    return max((len(k) for k in tokenizer.get_vocab()), default=64) or 1


@dataclass
class Thread:
    """One trajectory being recorded: its segments and the exact text they render to."""

    segments: list[Segment] = field(default_factory=list)
    text: str = ""
    uid: str = field(default_factory=_new_uid)
    parent_uid: str | None = None
    branch_token: int | None = None
    tool_calls: Counter[str] = field(default_factory=Counter)
    finish_reason: str = "running"
    requests: int = 0
    gen_time_s: float = 0.0

    @property
    def length(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]


@dataclass
class Prepared:
    """A request rendered and placed: what the policy is given, and where its answer goes."""

    prompt_ids: list[int]
    thread: Thread | None  # the trajectory it continues (None: a new one)
    base_len: int  # that trajectory's length when the request was placed
    delta_ids: list[int]  # the new tokens after it (tool or user turns)
    delta_text: str
    rendered: str
    prefix_break: bool
    tool_names: tuple[str, ...]


class EpisodeRecord:
    """The requests of one episode, stitched into trajectories (see the module docstring).

    Args:
        key: The episode's API key (names it; the agent cannot forge another's).
        chat: The run's chat template (its `tools` are set per request).
        policy: The policy that answers.
        params: Base sampling parameters (the run's); `max_tokens`, `stop` and `seed` are set per request.
        seed: Episode seed; request i samples with `derive_seed(seed, i)`.
        max_context_tokens: Most tokens of one trajectory (prompt and completion).
        token_chars: `longest_token_chars` of the tokenizer (None: computed here).
    """

    def __init__(self, key: str, chat: ChatTemplate, policy: Policy, params: SamplingParams, seed: int,
                 max_context_tokens: int, token_chars: int | None = None):  # fmt: skip
        self.key = key
        self.chat = chat
        self.policy = policy
        self.params = params
        self.seed = int(seed)
        self.max_context_tokens = max_context_tokens
        self.token_chars = token_chars or longest_token_chars(chat.tokenizer)
        self.max_prompt_chars = self.token_chars * max_context_tokens
        self.threads: list[Thread] = []
        self.prefix_breaks = 0
        self.requests = 0  # answered requests
        self.calls = 0  # generate calls started (the seed index)
        self.admitted = 0  # requests taken in (checked against rollout.endpoint.max_requests_per_episode)
        self.closed = False
        self.uid = _new_uid()
        self.t_start = time.monotonic()
        # tool-call id -> (raw text, tool name, the turn's (content, calls) as answered)
        self._by_call_id: dict[str, tuple[str, str, tuple[str, tuple[tuple[str, str], ...]]]] = {}
        self._by_content: dict[Any, str] = {}  # (content, calls) -> raw text
        self._lock = threading.Lock()  # held by `record` while it changes the trajectories, by `prepare` to read them
        self._eos_id: int | None = chat.tokenizer.eos_token_id

    # ---- messages -----------------------------------------------------
    def canonical(self, messages: Any) -> tuple[list[dict[str, Any]], int]:
        """The messages as the template renders them, and how many carry an assistant turn this episode produced
        (as it was produced, or edited: an edit keeps its tool-call ids but not its content or calls).

        Raises:
            RequestError: A malformed message (400).
        """
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list of messages", "invalid_messages", "messages")
        out: list[dict[str, Any]] = []
        ours = 0
        for i, m in enumerate(messages):
            param = f"messages[{i}]"
            if not isinstance(m, Mapping) or m.get("role") not in ROLES:
                raise RequestError(400, f"{param} must be an object with a role in {', '.join(ROLES)}",
                                   "invalid_messages", param)  # fmt: skip
            role = m["role"]
            content = content_text(m.get("content"), f"{param}.content")
            if role == "assistant":
                calls = m.get("tool_calls") or []
                if not isinstance(calls, list):
                    raise RequestError(400, f"{param}.tool_calls must be a list", "invalid_messages", param)
                pairs = []
                for j, c in enumerate(calls):
                    fn = c.get("function") if isinstance(c, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                        raise RequestError(400, f"{param}.tool_calls[{j}] needs function.name and function.arguments",
                                           "invalid_messages", param)  # fmt: skip
                    pairs.append((fn["name"], fn.get("arguments", "{}")))
                raw, issued = self._recognize(calls, content, pairs)
                ours += issued
                if raw is not None:
                    out.append({"role": "assistant", "content": raw})
                    continue
                msg: dict[str, Any] = {"role": "assistant", "content": content or ""}
                if pairs:
                    msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in pairs]
                out.append(msg)
            elif role == "tool":
                if content is None:
                    raise RequestError(400, f"{param}.content is required for a tool message", "invalid_messages", param)
                msg = {"role": "tool", "content": content}
                known = self._by_call_id.get(str(m.get("tool_call_id")))
                if known is not None:
                    msg["name"] = known[1]
                elif isinstance(m.get("name"), str):
                    msg["name"] = m["name"]
                out.append(msg)
            else:
                if content is None:
                    raise RequestError(400, f"{param}.content is required for a {role} message", "invalid_messages", param)
                out.append({"role": "system" if role == "developer" else role, "content": content})
        return out, ours

    def _recognize(self, calls: list[Any], content: str | None, pairs: list[tuple[str, Any]]) -> tuple[str | None, bool]:
        """(the turn's raw text if it is one this episode produced, unchanged; whether it is one, edited or not).

        A turn is recognized by a tool-call id the endpoint issued, or by its content and calls; by an id
        only when its content and calls are still those answered: an edited turn is rendered as the agent
        sent it (so it cannot continue the recorded ids) and the request is a prefix break.
        """
        key = _call_key(content, pairs)
        for c in calls:
            hit = self._by_call_id.get(str(c.get("id"))) if isinstance(c, Mapping) else None
            if hit is not None:
                return (hit[0] if hit[2] == key else None), True
        raw = self._by_content.get(key)
        return raw, raw is not None

    # ---- placing and recording -------------------------------------------
    def prepare(self, messages: Any, tools: Any) -> Prepared:
        """Render a request and find the trajectory it continues.

        Raises:
            RequestError: Malformed messages or tools (400), or a prompt that leaves
                no room in the context budget (400 `context_length_exceeded`).
        """
        msgs, ours = self.canonical(messages)
        names: tuple[str, ...] = ()
        chat = self.chat
        if tools is not None:
            if not isinstance(tools, list) or not all(
                isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) and isinstance(t["function"].get("name"), str)
                for t in tools
            ):
                raise RequestError(400, "'tools' must be a list of {type: function, function: {name, parameters}}",
                                   "invalid_tools", "tools")  # fmt: skip
            names = tuple(t["function"]["name"] for t in tools)
            chat = dataclasses.replace(chat, tools=[dict(t) for t in tools] or None)
        try:
            rendered = chat.render(msgs, add_generation_prompt=True)
        except ConfigError as e:  # the template refused these messages (roles out of order, ...): the request's fault
            raise RequestError(400, f"the messages could not be rendered: {e}", "invalid_messages", "messages") from None
        # the bound before tokenizing: a token is at most `longest_token_chars` characters of text, so a longer
        # rendering cannot fit the context (tokenizing megabytes to find that out would cost seconds)
        if len(rendered) > self.max_prompt_chars:
            raise RequestError(
                400,
                f"this request renders to {len(rendered)} characters, at least {len(rendered) // self.token_chars + 1} "
                f"tokens ({self.token_chars} characters per token at most); the context budget "
                f"(env.max_context_tokens) is {self.max_context_tokens}",
                "context_length_exceeded", "messages",
            )  # fmt: skip
        best: Thread | None = None
        # prepare may run on a worker thread while the loop records: the trajectory is read once, as matched
        with self._lock:
            for t in self.threads:
                if rendered.startswith(t.text) and (best is None or len(t.text) > len(best.text)):
                    best = t
            if best is not None:
                base_text, base_ids, base_len = best.text, best.ids, best.length
        if best is not None:
            delta_text = rendered[len(base_text) :]
            delta = chat.encode(delta_text)
            prompt = base_ids + delta
            prep = Prepared(prompt, best, base_len, delta, delta_text, rendered, False, names)
        else:
            prompt = chat.encode(rendered)
            prep = Prepared(prompt, None, 0, prompt, rendered, rendered, ours > 0, names)
        if len(prompt) >= self.max_context_tokens:
            raise RequestError(
                400,
                f"this request's prompt is {len(prompt)} tokens; the context budget (env.max_context_tokens) is "
                f"{self.max_context_tokens}, which leaves no room for a completion",
                "context_length_exceeded", "messages",
            )  # fmt: skip
        return prep

    def sampling(self, max_tokens: int | None, stop: tuple[str, ...], prompt_len: int) -> SamplingParams:
        """The request's sampling parameters: the run's, its token cap within the context, its own seed."""
        from agentenv.rollout.engine import derive_seed

        cap = self.params.max_tokens if max_tokens is None else min(max_tokens, self.params.max_tokens)
        budget = max(1, min(cap, self.max_context_tokens - prompt_len))
        seed = derive_seed(self.seed, self.calls)
        self.calls += 1
        return dataclasses.replace(self.params, max_tokens=budget, stop=tuple(stop), seed=seed)

    def place(self, prep: Prepared) -> Thread:
        """The trajectory an answer to `prep` goes to (its uid is in the reply): the one the request continues,
        unless another answer extended it meanwhile; else a new one, recorded by `record` only."""
        parent = prep.thread
        if parent is not None and parent.length == prep.base_len and not self.closed:
            return parent
        thread = Thread(text=prep.rendered)
        if parent is not None:  # a second answer on the same prefix: a branch with the same exact ids
            thread.parent_uid, thread.branch_token = parent.uid, prep.base_len
        # a branch's history is its prompt here (its policy tokens are trained once, in the parent)
        thread.segments.append(Segment("prompt", list(prep.prompt_ids)))
        return thread

    def record(self, prep: Prepared, gen: Generation, calls: list[dict[str, Any]], content: str | None,
               gen_time_s: float, thread: Thread | None = None) -> Thread:  # fmt: skip
        """Add an answered request to its trajectory, `place`'s (given, it must have been placed with nothing
        recorded since: no await between); remember the turn for recognition."""
        thread = thread or self.place(prep)
        policy = Segment("policy", list(gen.token_ids), list(gen.logprobs), list(gen.entropies),
                         None if gen.versions is None else list(gen.versions))
        ids = list(gen.token_ids)
        raw_ids = ids[:-1] if ids and self._eos_id is not None and ids[-1] == self._eos_id else ids
        turn_text, raw = self.chat.decode(ids), self.chat.decode(raw_ids)
        key = _call_key(content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
        with self._lock:
            if thread is prep.thread:
                if thread.length != prep.base_len:
                    raise RuntimeError("the trajectory was extended after the answer was placed: place, then record, "
                                       "with no await between")  # fmt: skip
                if prep.delta_ids:
                    thread.segments.append(Segment("tool", list(prep.delta_ids)))
                thread.text += prep.delta_text
            else:
                self.threads.append(thread)
            thread.segments.append(policy)
            thread.text += turn_text
        thread.requests += 1
        thread.gen_time_s += gen_time_s
        thread.finish_reason = gen.finish_reason
        for c in calls:
            thread.tool_calls[c["function"]["name"]] += 1
            self._by_call_id[c["id"]] = (raw, c["function"]["name"], key)
        self._by_content[key] = raw
        self.requests += 1
        return thread

    def trajectories(self, task_id: str) -> list[Trajectory]:
        """The recorded trajectories (copies), reward not yet set."""
        out = []
        for t in self.threads:
            out.append(Trajectory(
                task_id=task_id,
                segments=[Segment(s.source, list(s.token_ids), None if s.logprobs is None else list(s.logprobs),
                                  None if s.entropies is None else list(s.entropies),
                                  None if s.versions is None else list(s.versions)) for s in t.segments],
                finish_reason=t.finish_reason,
                tool_calls=dict(t.tool_calls),
                gen_time_s=t.gen_time_s,
                uid=t.uid,
                parent_uid=t.parent_uid,
                branch_token=t.branch_token,
                episode=self.uid,
                info={"requests": t.requests, "seed": self.seed,
                      "generated_tokens": sum(len(s) for s in t.segments if s.source == "policy")},
            ))  # fmt: skip
        return out

    def summary(self) -> dict[str, Any]:
        """What the episode's own key may read: its trajectories' sizes, never their tokens' text."""
        return {
            "episode": self.uid,
            "requests": self.requests,
            "prefix_breaks": self.prefix_breaks,
            "trajectories": [
                {"uid": t.uid, "tokens": t.length, "requests": t.requests, "parent_uid": t.parent_uid}
                for t in self.threads
            ],
        }
