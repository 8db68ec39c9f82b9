"""Named containers that cross module boundaries.

Token-in, token-out: an episode's context is a list of token ids that only ever
grows by appending. It is never decoded and re-encoded. Every token is created
inside a `Segment` that knows its source, so the loss mask is fixed the moment
the token exists (policy tokens 1, prompt and tool tokens 0).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from agentenv.tasks.task import Task

SegmentSource = Literal["prompt", "policy", "tool"]
FinishReason = Literal["stop", "eos", "length"]
ToolErrorKind = Literal["timeout", "sandbox", "http", "refused", "agent", "error"]
"""Why a tool call failed: `timeout` (the call ran out of time), `sandbox` (the sandbox could not run the code),
`http` (a server or the network failed), `refused` (the tool would not take the call: empty or oversized input),
`agent` (the tool worked and the agent's own code or request failed: an exception, a non-zero exit), `error`
(a tool that did not say)."""
TOOL_ERROR_KINDS: tuple[ToolErrorKind, ...] = ("timeout", "sandbox", "http", "refused", "agent", "error")
TOOL_FAULT_KINDS: tuple[ToolErrorKind, ...] = ("timeout", "sandbox", "http", "refused", "error")
"""The kinds that say a tool did not do its job (all but `agent`): these are counted as tool failures."""



class Tokenizer(Protocol):
    """The tokenizer surface agentenv calls; a transformers tokenizer (`PreTrainedTokenizerBase`) is one.

    Text to ids and back, without adding or cleaning up special tokens where
    the caller says so; the chat template for prompts; the ids that end or pad
    a sequence.
    """

    @property
    def eos_token_id(self) -> int | None:
        """The id that ends a sequence (None: the tokenizer has none)."""
        ...

    @property
    def pad_token_id(self) -> Any: ...

    @property
    def chat_template(self) -> Any:
        """Its own chat template (None: it has none)."""
        ...

    @property
    def name_or_path(self) -> str: ...

    @property
    def model_max_length(self) -> int:
        """The model's context length as the tokenizer knows it (transformers' "unknown" is ~1e30)."""
        ...

    @property
    def all_special_tokens(self) -> list[str]: ...

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """Added tokens by id (`tokenizers.AddedToken`: `content`, `special`)."""
        ...

    def get_vocab(self) -> dict[str, int]: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def convert_tokens_to_ids(self, tokens: Any) -> Any: ...

    def __len__(self) -> int: ...


# --------------------------------------------------------------------------- optional capabilities of parts
# A part (policy, tool, env) that has one of these declares it by having the member; whoever builds the part
# asks `isinstance(part, Closeable)` once, instead of probing the part for a method by its name.
@runtime_checkable
class Closeable(Protocol):
    """Holds processes or memory until `close()` (idempotent)."""

    def close(self) -> None: ...


@runtime_checkable
class AsyncCloseable(Protocol):
    """Holds connections or processes until `await aclose()` (idempotent)."""

    async def aclose(self) -> None: ...


@runtime_checkable
class HasMetrics(Protocol):
    """Counts what it did: `metrics()` (name -> number) since start or `reset_metrics`, where it has one."""

    def metrics(self) -> dict[str, float]: ...


@runtime_checkable
class ResetsMetrics(Protocol):
    """Starts its counters again at `reset_metrics()`."""

    def reset_metrics(self) -> None: ...

@dataclass(frozen=True)
class SamplingParams:
    """How a policy samples one turn. Mirrors vLLM's `SamplingParams`.

    Attributes:
        max_tokens: Most tokens to generate in this call.
        temperature: Softmax temperature; 0 means greedy decoding.
        top_p: Nucleus sampling mass in (0, 1].
        top_k: Keep the k most likely tokens; 0 or -1 disables.
        stop: Strings that end the turn. The stop string's tokens stay in the
            output so the context stays exact.
        seed: Per-request seed; the same seed gives the same sample.
        include_eos: Whether an EOS token that ends the turn is kept in
            `Generation.token_ids` (it is, by default, so the context is exact).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    include_eos: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1, 0 or a positive int, got {self.top_k!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError(f"SamplingParams.stop must not contain empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Generation:
    """What a policy returns for one `generate` call.

    `token_ids` include the stop string's tokens (and the EOS token when
    `SamplingParams.include_eos`), so appending them keeps the context exact.
    `logprobs[i]` is the sampler's log-probability of `token_ids[i]`;
    `entropies[i]` the entropy (nats) of the distribution it was sampled from.
    `versions[i]`, when the policy versions its weights, is the weight version
    that sampled `token_ids[i]` (a request that a weight push overtook has
    tokens of two versions); None when the policy does not report one.
    """

    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None
    versions: list[int] | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.entropies) != n:
            raise ValueError(
                f"Generation has {n} tokens but {len(self.logprobs)} logprobs and {len(self.entropies)} entropies"
            )
        if self.versions is not None and len(self.versions) != n:
            raise ValueError(f"Generation has {n} tokens but {len(self.versions)} versions")


class PolicyText(str):
    """What the policy wrote in an episode, as a reward reads it: its turns, each its own text.

    As a `str` it is the turns joined by newlines (for a reward that only needs
    the words); `turns` keeps them apart. A reward that reads tags or an answer
    must read each turn alone (`turns_of`): nothing written in one turn
    completes a tag or an answer opened in another.
    """

    turns: tuple[str, ...]

    def __new__(cls, turns: Iterable[str]) -> PolicyText:
        turns = tuple(turns)
        obj = super().__new__(cls, "\n".join(turns))
        obj.turns = turns
        return obj

    def __getnewargs__(self) -> tuple[tuple[str, ...]]:  # type: ignore[override]  # pickling rebuilds it from its turns, not from str's text
        return (self.turns,)


def turns_of(response: str) -> tuple[str, ...]:
    """The turns of a response: a `PolicyText`'s, else the whole text as one turn (ARPO's format is one turn)."""
    return response.turns if isinstance(response, PolicyText) else (response,)


def clean_text(text: str) -> str:
    """`text` with every lone surrogate and NUL character replaced by U+FFFD (a valid surrogate pair joined).

    A tool's text may hold them (a JSON answer's `"\\ud800"`, a program's
    output); a lone surrogate cannot be encoded (a tokenizer or a cache raises),
    and NUL is no text a model reads.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


@dataclass
class ToolResult:
    """A tool's answer to one call. The agent's mistakes are results, not exceptions.

    Attributes:
        text: What the model reads.
        ok: False when the call failed for a reason the model can act on.
        error: A short reason the model can read (None when ok).
        latency_s: Wall time of the call.
        metadata: Anything else (exit status, cache hit, urls, ...).
        kind: Why it failed (`ToolErrorKind`); None when ok. A failed result
            that names no kind is `error`.
    """

    text: str
    ok: bool = True
    error: str | None = None
    latency_s: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    kind: ToolErrorKind | None = None

    def __post_init__(self) -> None:
        if self.ok:
            self.kind = None
        elif self.kind is None:
            self.kind = "error"
        elif self.kind not in TOOL_ERROR_KINDS:
            raise ValueError(f"ToolResult.kind must be one of {TOOL_ERROR_KINDS}, got {self.kind!r}")
        # Whatever a tool read (a search answer, a page, a program's output) is text every
        # later step can encode: a cache, a tokenizer (`clean_text`).
        if isinstance(self.text, str):
            self.text = clean_text(self.text)
        if isinstance(self.error, str):
            self.error = clean_text(self.error)


@dataclass
class Segment:
    """A run of token ids from one source.

    Policy segments carry the sampler's per-token `logprobs` and `entropies`
    and, when the policy versions its weights, `versions`: the weight version
    that sampled each token (`Generation.versions`); prompt and tool segments
    carry none.
    """

    source: SegmentSource
    token_ids: list[int]
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    versions: list[int] | None = None

    def __post_init__(self) -> None:
        if self.source not in ("prompt", "policy", "tool"):
            raise ValueError(f"Segment.source must be prompt, policy or tool, got {self.source!r}")
        if self.source == "policy":
            n = len(self.token_ids)
            if self.logprobs is None or self.entropies is None:
                raise ValueError("a policy Segment needs logprobs and entropies")
            if len(self.logprobs) != n or len(self.entropies) != n:
                raise ValueError(
                    f"policy Segment has {n} tokens, {len(self.logprobs)} logprobs, {len(self.entropies)} entropies"
                )
            if self.versions is not None and len(self.versions) != n:
                raise ValueError(f"policy Segment has {n} tokens but {len(self.versions)} versions")

    @property
    def mask_value(self) -> int:
        return 1 if self.source == "policy" else 0

    def __len__(self) -> int:
        return len(self.token_ids)


def _new_uid() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Trajectory:
    """The segments of one episode and what came of it.

    Attributes:
        task_id: The task this episode solved.
        segments: Prompt first, then alternating policy and tool segments.
        reward: The episode's scalar reward (set when it ends).
        finish_reason: Why it ended: `answer`, `eos`, `length`, `tool_limit`,
            `context`, `error`, or `running` while still going.
        tool_calls: Count of calls per tool name (malformed calls under `invalid`).
        tool_errors: Failed calls per tool name and `ToolResult.kind`.
        tool_time_s: Total wall time spent inside tools.
        gen_time_s: Total wall time spent waiting for the policy.
        failed: True when infrastructure failed; a failed trajectory is masked
            from the loss and never aborts its group.
        error: The failure's message when `failed`.
        uid: Unique id.
        parent_uid: For tree samplers, the trajectory this one branched off.
        branch_token: Token index (into `token_ids`) where it branched off; the
            tokens before it are shared with the parent.
        state_keys: The env's name for the state before each policy turn, one
            per policy segment (`AgentEnv`: a hash of the context so far,
            `agentenv.envs.state`); equal keys, equal states (GiGPO's anchor
            states). Empty when the env gives none.
        episode: The episode it belongs to, where one episode records several
            trajectories (a user's agent through the endpoint); None: an episode
            of its own. A group's statistics count episodes, not trajectories
            (`agentenv.algorithms.core.episode_rewards`).
        info: Reward details and anything else worth logging.
    """

    task_id: str
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0
    finish_reason: str = "running"
    tool_calls: dict[str, int] = field(default_factory=dict)
    tool_errors: dict[str, dict[str, int]] = field(default_factory=dict)
    tool_time_s: float = 0.0
    gen_time_s: float = 0.0
    failed: bool = False
    error: str | None = None
    uid: str = field(default_factory=_new_uid)
    parent_uid: str | None = None
    branch_token: int | None = None
    state_keys: list[str] = field(default_factory=list)
    episode: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        """The reward function judged the answer correct (never for a failed trajectory).

        The env records its reward details under `info["reward"]`.
        """
        return bool(self.info.get("reward", {}).get("correct", False)) and not self.failed

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 exactly on policy tokens; 0 on prompt and tool tokens; all 0 if failed."""
        if self.failed:
            return [0] * sum(len(s) for s in self.segments)
        return [s.mask_value for s in self.segments for _ in s.token_ids]

    @property
    def logprobs(self) -> list[float]:
        """Sampler logprobs aligned with `token_ids` (0.0 on non-policy tokens)."""
        return [lp for s in self.segments for lp in (cast(list[float], s.logprobs) if s.source == "policy" else [0.0] * len(s))]

    @property
    def entropies(self) -> list[float]:
        """Sampler entropies aligned with `token_ids` (0.0 on non-policy tokens)."""
        return [h for s in self.segments for h in (cast(list[float], s.entropies) if s.source == "policy" else [0.0] * len(s))]

    @property
    def versions(self) -> list[int | None]:
        """The weight version of each policy token, in order (None where the policy reported none)."""
        none: list[int | None] = [None]
        return [v for s in self.segments if s.source == "policy" for v in (s.versions or none * len(s))]

    @property
    def prompt_len(self) -> int:
        n = 0
        for s in self.segments:
            if s.source != "prompt":
                break
            n += len(s)
        return n

    @property
    def num_policy_tokens(self) -> int:
        return sum(len(s) for s in self.segments if s.source == "policy")

    @property
    def num_tool_calls(self) -> int:
        return sum(v for k, v in self.tool_calls.items() if k != "invalid")

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)


@dataclass
class Group:
    """The trajectories sampled for one task; advantages are computed per group."""

    task: Task
    trajectories: list[Trajectory] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)
