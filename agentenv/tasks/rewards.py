"""Rewards by name (`env.reward`): ARPO's hierarchical reward, F1, exact match, math equality.

A reward is a function `reward(response, task, tool_calls)`:

- `response`: the text the policy wrote in the episode: from an `AgentEnv`, an
  `agentenv.types.PolicyText`, a `str` (its turns joined by newlines) whose
  `turns` holds each turn decoded alone; any other string is one turn;
- `task`: the `Task` (its `ground_truth`, `metadata["answers"]`, `ability`);
- `tool_calls`: calls per tool name in the episode, e.g. `{"search": 2, "python": 1}`
  (`"invalid"` counts malformed calls and calls past the limit);

and returns a `RewardResult` (or any object with `score` and `correct`), or a
`(score, correct)` pair. Register one with `register_reward("name", fn)`, name
it in a config as `module:attr`, or ship it in the `agentenv.rewards`
entry-point group. Built in:

- `arpo`: ARPO's hierarchical reward (below);
- `f1`: token-level F1 of the answer against the references (correct: exact match);
- `exact`: 1 for a normalized exact match, else 0;
- `math`: 1 when the answer equals a reference as a number or symbolically
  (`mathcheck.math_equal`: a sympy worker with a time bound), else 0.

`f1`, `exact` and `math` read the answer from the last `<answer>...</answer>`
block (the last `\\boxed{}` inside it, if any) and score 0 when there is none.

ARPO (arXiv 2507.19849) scores a rollout in three tiers:

- -1 when the format is wrong: unbalanced `<think>/<search>/<python>/<browse>/<answer>`
  tags, a `<result>` tag the policy wrote itself, no `<answer>...</answer>`, or no
  `\\boxed{}` inside the answer;
- otherwise correctness: token-level F1 for QA, exact or symbolic equality for math;
- +0.1 (r_M) when the score is above 0 and the rollout used both search and
  python: the paper's max(Acc + r_M, Acc) for a right format and Acc > 0, so a
  partly right QA answer (F1 > 0) earns it too, as in the published code.
  (agentenv gave it only on an exact match before: 0.667 where the paper and
  its code give 0.767 for an F1 of 2/3 with both tools.)

The response scored is what the policy wrote, never the tools' results: a tool
that prints `<answer>\\boxed{42}</answer>` earns nothing, and a result holding
`</result>` or `<answer>` cannot spoil the policy's format. (ARPO's check ran
over the whole rollout, results included, which let a tool's text do both.)

Each turn is its own text: every built-in reward reads the tags and the answer
of each policy turn alone (`agentenv.types.turns_of`), so nothing written in one
turn completes a tag or an answer opened in another. `<answer>\\boxed{4` in one
turn and `2}</answer>` in the next is no answer of 42 (ARPO: -1, unbalanced
turns; f1, exact, math: 0, no answer), nor is an `<answer>` opened before a
tool call and closed after its result.
ARPO's format is one assistant turn; a plain string is scored as that one turn.
A reward of your own that reads tags should do the same (`turns_of(response)`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import math
import numbers
import re
import string
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from agentenv.errors import ConfigError
from agentenv.registry import Registry
from agentenv.tasks.mathcheck import math_equal, normalize_math, unwrap_text
from agentenv.tasks.task import Task
from agentenv.tasks.worker import WAIT_CLOCK, VerifierTimeout, WaitClock
from agentenv.types import turns_of

FORMAT_TAGS: tuple[str, ...] = ("think", "search", "python", "browse", "answer")
"""Tags whose opening and closing must alternate in the policy's text (`browse` is the browser tool's tag)."""
RESULT_TAG = "result"
"""Results are the env's: a policy that writes this tag forges one, which is a format error."""
MULTI_TOOL_BONUS = 0.1
"""r_M: added to a score above 0 when both search and python were called (ARPO's multi-tool reward)."""
_YES_NO = ("yes", "no", "noanswer")


@dataclass(frozen=True)
class RewardResult:
    """The score of one response and why.

    Attributes:
        score: The reward (-1 on a format error; correctness in [0, 1], +0.1 bonus).
        correct: Normalized exact match (QA) or equality (math).
        format_ok: The tags and the boxed answer are in place.
        answer: The text inside the last `\\boxed{}` of the answer, None if absent.
        reason: One short phrase (a format error, or the correctness verdict).
        error: Set by the reward gate when the verifier raised or ran past its
            time limit (`verifier_raised`, `verifier_timeout`): the score is then
            the reward's minimum.
    """

    score: float
    correct: bool
    format_ok: bool
    answer: str | None = None
    reason: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Scored:
    """A reward an environment computed itself, with its parts (a verifiers rubric's functions).

    Attributes:
        score: The reward (the parts' weighted sum, for a rubric).
        correct: Whether the episode counts as solved (accuracy, pass@k).
        parts: Each reward function's value, by name (logged, not summed here).
    """

    score: float
    correct: bool = False
    parts: Mapping[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- QA


def normalize_answer(s: str) -> str:
    """SQuAD-style normalization: lowercase, no punctuation, no articles (a/an/the), folded whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 of normalized strings; yes/no/noanswer must match exactly.

    >>> round(f1_score("the Eiffel tower", "Eiffel Tower Paris"), 6)
    0.8
    """
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in _YES_NO or truth in _YES_NO) and pred != truth:
        return 0.0
    pred_tokens, truth_tokens = pred.split(), truth.split()
    common = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, ground_truth: str) -> bool:
    """Normalized exact match."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


# ----------------------------------------------------------------------------- format


_BOX = re.compile(r"\\(?:boxed|fbox)")
_SPACED_BOX = re.compile(r" +([^\s$]+)")
_BRACE = re.compile(r"[{}]")


def _closing_braces(text: str) -> dict[int, int]:
    """Where each `{` of `text` closes (`{` index -> matching `}` index; unclosed ones absent), in one pass."""
    close: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text):
        if m[0] == "{":
            stack.append(m.start())
        elif stack:
            close[stack.pop()] = m.start()
    return close


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed x`, else None.

    An unclosed `\\boxed{` is skipped for an earlier one. Linear in the text: the
    braces are matched once, not rescanned for every `\\boxed`.
    """
    starts = [m.end() for m in _BOX.finditer(text)]
    close = _closing_braces(text) if starts else {}
    for start in reversed(starts):
        if text.startswith("{", start):
            end = close.get(start)
            if end is not None:
                return text[start + 1 : end]
            continue  # unclosed: try an earlier one
        m = _SPACED_BOX.match(text, start)
        if m:
            return m[1]
    return None


def tags_balanced(text: str, tags: Sequence[str] = FORMAT_TAGS) -> str | None:
    """None when every tag opens and closes in turn; else the name of the first offending tag."""
    for tag in tags:
        open_ = False
        for m in re.finditer(rf"<(/?){tag}>", text):
            closing = bool(m[1])
            if closing != open_:  # a close without an open, or a second open
                return tag
            open_ = not closing
        if open_:
            return tag
    return None


def _answer_block(response: str) -> str | None:
    """The inner text of the last `<answer>...</answer>` of one turn, else None (one pass, as `re.findall` pairs them)."""
    last, pos = None, 0
    while (i := response.find("<answer>", pos)) >= 0:
        j = response.find("</answer>", i + len("<answer>"))
        if j < 0:
            break
        last, pos = response[i + len("<answer>") : j], j + len("</answer>")
    return last


def _last_answer_block(response: str) -> str | None:
    """The last answer block of a response, each turn read alone (a block never spans two turns)."""
    blocks = (_answer_block(turn) for turn in reversed(turns_of(response)))
    return next((b for b in blocks if b is not None), None)


def check_format(response: str) -> tuple[bool, str | None, str]:
    """ARPO's format rule on what the policy wrote. Returns (ok, boxed answer or None, reason).

    Each turn of a `PolicyText` is checked alone: its tags open and close
    within it, so an answer opened in one turn and finished in the next is
    unbalanced, not an answer. A plain string is one turn.
    """
    turns = turns_of(response)
    for turn in turns:
        if re.search(rf"</?{RESULT_TAG}>", turn):
            return False, None, f"the policy wrote a <{RESULT_TAG}> tag (results come from tools)"
    for i, turn in enumerate(turns, start=1):
        bad = tags_balanced(turn)
        if bad:
            return False, None, f"unbalanced <{bad}> tags" + (f" in turn {i}" if len(turns) > 1 else "")
    block = _last_answer_block(response)
    if block is None:
        return False, None, "no <answer>...</answer>"
    boxed = extract_boxed(block)
    if boxed is None or not boxed.strip():
        return False, None, "no \\boxed{} in the answer"
    return True, boxed.strip(), "ok"


# ----------------------------------------------------------------------------- the gate

REWARD_ERROR_KINDS: tuple[str, ...] = ("not_a_number", "nan", "inf", "out_of_range", "verifier_raised", "verifier_timeout")
"""Why a reward did not pass the gate, counted per step as `rollout/reward_errors/KIND`. The first four
fail the trajectory; a verifier that raised or timed out scores the reward's minimum (wrong, not masked)."""
DEFAULT_VERIFIER_TIMEOUT_S = 10.0
"""The time limit of one scoring when no run config gives one (`env.reward_timeout_s`)."""
_BACKSTOP_S = 5.0
"""Extra seconds the gate waits for a reward function past its limit before giving up on the thread."""
_VERIFIER_TIMEOUT: contextvars.ContextVar[float] = contextvars.ContextVar("verifier_timeout_s", default=DEFAULT_VERIFIER_TIMEOUT_S)

F = TypeVar("F", bound=Callable[..., Any])


class RewardError(Exception):
    """A reward that cannot enter the advantage math; the trajectory fails, counted under `kind`."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def bounded(low: float, high: float) -> Callable[[F], F]:
    """Declare a reward function's range (a decorator): the gate fails a score outside `[low, high]`,
    and a verifier that raises or runs past its time limit scores `low`."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"a reward's range needs finite low < high, got [{low}, {high}]")

    def mark(fn: F) -> F:
        fn.reward_range = (float(low), float(high))  # type: ignore[attr-defined]  # read by reward_range()
        return fn

    return mark


@runtime_checkable
class Bounded(Protocol):
    """A reward function that declared its range (`bounded`)."""

    reward_range: tuple[float, float]


@runtime_checkable
class ScoreLike(Protocol):
    """A reward function's own result record: its score and whether the answer is correct (`RewardResult` is one)."""

    score: float
    correct: bool


@runtime_checkable
class Graded(ScoreLike, Protocol):
    """A result record that also says whether the format held."""

    format_ok: bool


@runtime_checkable
class Explained(Protocol):
    """A result record that says the answer it read and why (each part of a record is read on its own)."""

    answer: str | None
    reason: str


def reward_range(fn: Any) -> tuple[float, float]:
    """The range a reward function declared with `bounded` (unbounded when it declared none)."""
    return fn.reward_range if isinstance(fn, Bounded) else (-math.inf, math.inf)


def verifier_timeout_s() -> float:
    """The time limit of the scoring now running: a verifier that runs its check in the worker
    (`agentenv.tasks.worker`) passes it as `timeout_s`, so a runaway check is killed, not waited for."""
    return _VERIFIER_TIMEOUT.get()


def check_reward(value: Any, bounds: tuple[float, float], source: str) -> float:
    """A reward as a float, if it is a finite number within `bounds`.

    Raises:
        RewardError: `not_a_number`, `nan`, `inf` or `out_of_range`, naming `source` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError("not_a_number", f"{source} gave {value!r} ({type(value).__name__}), not a number")
    x = float(value)
    if math.isnan(x):
        raise RewardError("nan", f"{source} gave NaN")
    if math.isinf(x):
        raise RewardError("inf", f"{source} gave {x}")
    low, high = bounds
    if not low <= x <= high:
        raise RewardError("out_of_range", f"{source} gave {x:g}, outside its range [{low:g}, {high:g}]")
    return x


def _raw_score(r: Any) -> Any:
    if isinstance(r, tuple) and len(r) == 2:
        return r[0]
    return r.score if isinstance(r, ScoreLike) else r


def gated_score(fn: Any, response: str, task: Task, tool_calls: Mapping[str, int],
                timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S, clock: WaitClock | None = None) -> RewardResult:  # fmt: skip
    """`fn(response, task, tool_calls)` through the gate (synchronous; the env runs it in a thread).

    A verifier that raises, or that its worker cut off after `timeout_s`,
    scores the minimum of the range `fn` declared (`error` says which); a score
    that is not a finite number within the range raises.

    Raises:
        RewardError: The score failed the gate, or `fn` raised and declared no range (no minimum to give).
    """
    name = getattr(fn, "__name__", "the reward")
    bounds = reward_range(fn)
    token, waits = _VERIFIER_TIMEOUT.set(timeout_s), WAIT_CLOCK.set(clock)
    try:
        raw = fn(response, task, tool_calls)
    except VerifierTimeout as e:
        return _wrong("verifier_timeout", f"{name}: {e}", bounds)
    except Exception as e:  # noqa: BLE001 - a verifier's bug on the model's text: the answer is wrong
        return _wrong("verifier_raised", f"{name} raised {type(e).__name__}: {e}", bounds)
    finally:
        WAIT_CLOCK.reset(waits)
        _VERIFIER_TIMEOUT.reset(token)
    score = check_reward(_raw_score(raw), bounds, name)
    try:
        r = as_reward_result(raw)
    except Exception as e:  # noqa: BLE001 - a verdict that cannot be read (bool() of it raises): this episode's error
        raise RewardError("not_a_number", f"{name} gave a result that cannot be read ({type(e).__name__}: {e})") from None
    return r if r.score == score else replace(r, score=score)


def _wrong(kind: str, why: str, bounds: tuple[float, float]) -> RewardResult:
    if not math.isfinite(bounds[0]):
        raise RewardError(kind, f"{why}; it declares no range (agentenv.tasks.rewards.bounded), so there is no "
                                "minimum to score the answer with")  # fmt: skip
    return RewardResult(bounds[0], False, False, None, why[:300], error=kind)


_SCORERS: concurrent.futures.ThreadPoolExecutor | None = None
_SCORERS_LOCK = threading.Lock()


def _scoring_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads rewards are scored in: their own, so a reward function the gate gave up on (its thread runs on)
    holds one of these, never one of the loop's default executor (the hf policy's decode steps run there)."""
    global _SCORERS
    with _SCORERS_LOCK:
        if _SCORERS is None:
            _SCORERS = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="agentenv-reward")
        return _SCORERS


class RewardGate:
    """The one door every reward enters by: a reward function's score (the env's, an agent's answer) or
    a number from elsewhere (an agent's own float) must be a finite number within the reward's range.

    Args:
        fn: The reward function (`env.reward`); its declared range (`bounded`) applies to every number.
        timeout_s: The time limit of one scoring (`env.reward_timeout_s`).
    """

    def __init__(self, fn: Any, timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S):
        self.fn = fn
        self.bounds = reward_range(fn)
        self.timeout_s = timeout_s

    async def score(self, response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
        """Score in a worker thread (a check may take seconds and must not stall other episodes).

        A function that bounds none of its work runs past the limit in its
        thread (one of the gate's own, not the loop's default executor); the
        gate stops waiting `_BACKSTOP_S` later and scores it as a timeout. Time spent waiting for the verifier worker (another episode's
        check holding it, its restart) is not charged: one episode's runaway
        check must not cut off another's.

        Raises:
            RewardError: As `gated_score`.
        """
        clock = WaitClock()
        run = asyncio.get_running_loop().run_in_executor(_scoring_threads(), gated_score, self.fn, response, task,
                                                         dict(tool_calls), self.timeout_s, clock)  # fmt: skip
        start, limit = time.monotonic(), self.timeout_s + _BACKSTOP_S
        while (left := start + limit + clock.excused() - time.monotonic()) > 0:
            done, _ = await asyncio.wait({run}, timeout=left)
            if done:
                return run.result()
        run.cancel()  # the thread runs on; nobody waits for it
        name = getattr(self.fn, "__name__", "the reward")
        return _wrong("verifier_timeout", f"{name} gave no score within {limit:g} s", self.bounds)

    def check(self, value: Any, source: str) -> float:
        """A number from outside a reward function (an agent's float), held to the reward's range."""
        return check_reward(value, self.bounds, source)


def reward_error_counts(trajectories: Sequence[Any]) -> dict[str, float]:
    """`reward_errors/KIND` -> how many trajectories' rewards the gate stopped, every kind present (ranks sum them)."""
    counts = Counter(t.info.get("reward", {}).get("error") for t in trajectories)
    return {f"reward_errors/{kind}": float(counts[kind]) for kind in REWARD_ERROR_KINDS}


# ----------------------------------------------------------------------------- reward


def _references(task: Task) -> list[str]:
    answers = task.metadata.get("answers")
    return [str(a) for a in answers] if answers else [task.ground_truth]


@bounded(-1.0, 1.0 + MULTI_TOOL_BONUS)
def arpo_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
    """ARPO's hierarchical reward of one response.

    Args:
        response: What the policy wrote: its turns, decoded, without the
            tools' results (`AgentEnv.policy_text`, a `PolicyText`). Each turn is
            checked alone: a tag or an answer must open and close in the same
            turn (a plain string is one turn).
        task: The task; `ability` picks F1 (qa) or equality (math); every answer in
            `metadata["answers"]` is accepted (the best one counts).
        tool_calls: Calls per tool name, e.g. `{"search": 2, "python": 1}`.

    Returns:
        The score with its verdict.
    """
    ok, answer, reason = check_format(response)
    if not ok:
        return RewardResult(-1.0, False, False, None, reason)
    answer = cast(str, answer)  # check_format gives the answer whenever ok
    refs = _references(task)
    if task.ability == "math":
        correct = any(math_equal(answer, r) for r in refs)
        score = 1.0 if correct else 0.0
        verdict = "equal" if correct else f"not equal to {refs[0]!r}"
    else:
        text = unwrap_text(answer)
        score = max(f1_score(text, r) for r in refs)
        correct = any(exact_match(text, r) for r in refs)
        verdict = "exact match" if correct else f"F1 {score:.2f} against {refs[0]!r}"
    if score > 0 and tool_calls.get("search", 0) > 0 and tool_calls.get("python", 0) > 0:  # the paper: Acc > 0
        score += MULTI_TOOL_BONUS
        verdict += ", both tools used"
    return RewardResult(score, correct, True, answer, verdict)


def extract_answer(response: str) -> str | None:
    """The answer of a response: the last `<answer>` block, or the last `\\boxed{}` inside it; None without one."""
    block = _last_answer_block(response)
    if block is None:
        return None
    boxed = extract_boxed(block)
    answer = unwrap_text(boxed if boxed is not None else block).strip()
    return answer or None


def _judged(response: str, task: Task, judge: Callable[[str, list[str]], tuple[float, bool, str]]) -> RewardResult:
    """`judge(answer, references) -> (score, correct, reason)` on the response's answer; 0 without one."""
    answer = extract_answer(response)
    if answer is None:
        return RewardResult(0.0, False, False, None, "no <answer>...</answer>")
    score, correct, reason = judge(answer, _references(task))
    return RewardResult(score, correct, True, answer, reason)


@bounded(0.0, 1.0)
def f1_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
    """Token-level F1 of the answer against the best reference; correct on a normalized exact match."""

    def judge(answer: str, refs: list[str]) -> tuple[float, bool, str]:
        score = max(f1_score(answer, r) for r in refs)
        correct = any(exact_match(answer, r) for r in refs)
        return score, correct, "exact match" if correct else f"F1 {score:.2f}"

    return _judged(response, task, judge)


@bounded(0.0, 1.0)
def exact_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
    """1 when the answer matches a reference after SQuAD normalization, else 0."""

    def judge(answer: str, refs: list[str]) -> tuple[float, bool, str]:
        correct = any(exact_match(answer, r) for r in refs)
        return float(correct), correct, "exact match" if correct else "no match"

    return _judged(response, task, judge)


@bounded(0.0, 1.0)
def math_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
    """1 when the answer equals a reference (exact rationals, then sympy with a time bound), else 0."""

    def judge(answer: str, refs: list[str]) -> tuple[float, bool, str]:
        correct = any(math_equal(answer, r) for r in refs)
        return float(correct), correct, "equal" if correct else "not equal"

    return _judged(response, task, judge)


RewardFn = Callable[[str, Task, Mapping[str, int]], Any]
"""What a user registers: (response, task, tool calls by name) -> a `RewardResult`, (score, correct) or an object with `.score`."""


@runtime_checkable
class Reward(Protocol):
    """A reward as the env calls it (`get_reward` adapts every registered `RewardFn` to one)."""

    def __call__(self, response: str, task: Task, tool_calls: Mapping[str, int], /) -> RewardResult: ...


def _as_reward(fn: Any, key: str) -> Reward:
    """A reward function whose result is always a `RewardResult`."""
    if not callable(fn):
        raise ConfigError(key, f"{fn!r} is not a reward function (response, task, tool_calls) -> score")

    def reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
        return as_reward_result(fn(response, task, tool_calls))

    reward.__name__ = getattr(fn, "__name__", "reward")
    reward.reward_range = reward_range(fn)  # type: ignore[attr-defined]  # the gate holds every score to it
    reward.__wrapped__ = fn  # type: ignore[attr-defined]  # functools' convention: the user's function behind the adapter
    return reward


def as_reward_result(r: Any) -> RewardResult:
    """A reward function's result as a `RewardResult`."""
    if isinstance(r, RewardResult):
        return r
    if isinstance(r, tuple) and len(r) == 2:
        score, correct = r
        return RewardResult(float(score), bool(correct), True, None, "")
    if isinstance(r, ScoreLike):
        format_ok = bool(r.format_ok) if isinstance(r, Graded) else True
        answer, reason = (r.answer, str(r.reason)) if isinstance(r, Explained) else (None, "")
        return RewardResult(float(r.score), bool(r.correct), format_ok, answer, reason)
    raise TypeError(f"a reward must return a RewardResult, an object with .score and .correct, or (score, correct); got {r!r}")


REWARDS: Registry[Reward] = Registry("reward", "env.reward", group="agentenv.rewards", adapt=_as_reward)
"""Reward functions by the name a config gives (`env.reward`)."""


def register_reward(name: str, fn: RewardFn | str, *, overwrite: bool = False) -> None:
    """Register a reward function (or a lazy `"module:attr"` string) under `name`."""
    REWARDS.register(name, fn, overwrite=overwrite)


def get_reward(name: str) -> Reward:
    """The reward function called `name` (registered, an entry point, or `module:attr`).

    Raises:
        ConfigError: Unknown name (with the closest known ones) or a plugin that fails to import.
    """
    return REWARDS.get(name)


register_reward("arpo", arpo_reward)
register_reward("f1", f1_reward)
register_reward("exact", exact_reward)
register_reward("math", math_reward)
register_reward("reasoning_gym", "agentenv.tasks.reasoning_gym:reasoning_gym_reward")  # the dataset's own verifier


__all__ = [
    "REWARD_ERROR_KINDS",
    "RewardError",
    "RewardGate",
    "bounded",
    "check_reward",
    "gated_score",
    "reward_error_counts",
    "reward_range",
    "verifier_timeout_s",
    "FORMAT_TAGS",
    "MULTI_TOOL_BONUS",
    "RESULT_TAG",
    "REWARDS",
    "Scored",
    "Reward",
    "RewardFn",
    "RewardResult",
    "arpo_reward",
    "as_reward_result",
    "check_format",
    "exact_match",
    "exact_reward",
    "extract_answer",
    "extract_boxed",
    "f1_reward",
    "f1_score",
    "get_reward",
    "math_reward",
    "math_equal",
    "normalize_answer",
    "normalize_math",
    "register_reward",
    "tags_balanced",
]
