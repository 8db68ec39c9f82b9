"""ARPO's hierarchical reward, and the registry of reward functions.

ARPO (arXiv 2507.19849) scores a rollout in three tiers:

- -1 when the format is wrong: unbalanced `<think>/<search>/<python>/<browse>/<answer>`
  tags, a `<result>` tag the policy wrote itself, no `<answer>...</answer>`, or no
  `\\boxed{}` inside the answer;
- otherwise correctness: token-level F1 for QA, exact or symbolic equality for math;
- +0.1 when the answer is correct and the rollout used both search and python.

The response scored is what the policy wrote, never the tools' results: a tool
that prints `<answer>\\boxed{42}</answer>` earns nothing, and a result holding
`</result>` or `<answer>` cannot spoil the policy's format. (ARPO's check ran
over the whole rollout, results included, which let a tool's text do both.)
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agentenv.errors import ConfigError
from agentenv.tasks.mathcheck import math_equal, normalize_math, unwrap_text
from agentenv.tasks.task import Task

FORMAT_TAGS: tuple[str, ...] = ("think", "search", "python", "browse", "answer")
"""Tags whose opening and closing must alternate in the policy's text (`browse` is the browser tool's tag)."""
RESULT_TAG = "result"
"""Results are the env's: a policy that writes this tag forges one, which is a format error."""
MULTI_TOOL_BONUS = 0.1
"""Added to a correct answer when both search and python were called (ARPO's multi-tool reward)."""
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
    """

    score: float
    correct: bool
    format_ok: bool
    answer: str | None
    reason: str


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


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed x`, else None."""
    for start in reversed([m.end() for m in re.finditer(r"\\(?:boxed|fbox)", text)]):
        rest = text[start:]
        if rest.startswith("{"):
            depth = 0
            for j, ch in enumerate(rest):
                depth += {"{": 1, "}": -1}.get(ch, 0)
                if depth == 0:
                    return rest[1:j]
            continue  # unclosed: try an earlier one
        m = re.match(r" +([^\s$]+)", rest)
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
    blocks = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return blocks[-1] if blocks else None


def check_format(response: str) -> tuple[bool, str | None, str]:
    """ARPO's format rule on what the policy wrote. Returns (ok, boxed answer or None, reason)."""
    if re.search(rf"</?{RESULT_TAG}>", response):
        return False, None, f"the policy wrote a <{RESULT_TAG}> tag (results come from tools)"
    bad = tags_balanced(response)
    if bad:
        return False, None, f"unbalanced <{bad}> tags"
    block = _answer_block(response)
    if block is None:
        return False, None, "no <answer>...</answer>"
    boxed = extract_boxed(block)
    if boxed is None or not boxed.strip():
        return False, None, "no \\boxed{} in the answer"
    return True, boxed.strip(), "ok"


# ----------------------------------------------------------------------------- reward


def _references(task: Task) -> list[str]:
    answers = task.metadata.get("answers")
    return [str(a) for a in answers] if answers else [task.ground_truth]


def arpo_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> RewardResult:
    """ARPO's hierarchical reward of one response.

    Args:
        response: What the policy wrote: its turns, decoded, without the
            tools' results (`AgentEnv.policy_text`).
        task: The task; `ability` picks F1 (qa) or equality (math); every answer in
            `metadata["answers"]` is accepted (the best one counts).
        tool_calls: Calls per tool name, e.g. `{"search": 2, "python": 1}`.

    Returns:
        The score with its verdict.
    """
    ok, answer, reason = check_format(response)
    if not ok:
        return RewardResult(-1.0, False, False, None, reason)
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
    if correct and tool_calls.get("search", 0) > 0 and tool_calls.get("python", 0) > 0:
        score += MULTI_TOOL_BONUS
        verdict += ", both tools used"
    return RewardResult(score, correct, True, answer, verdict)


RewardFn = Callable[[str, Task, Mapping[str, int]], RewardResult]

REWARDS: dict[str, RewardFn] = {"arpo": arpo_reward}
"""Reward functions by the name a config gives (`env.reward`)."""


def get_reward(name: str) -> RewardFn:
    """The reward function registered under `name`.

    Raises:
        ConfigError: Unknown name; the message lists the known ones.
    """
    try:
        return REWARDS[name]
    except KeyError:
        raise ConfigError("reward", f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}") from None


__all__ = [
    "FORMAT_TAGS",
    "MULTI_TOOL_BONUS",
    "RESULT_TAG",
    "REWARDS",
    "RewardFn",
    "RewardResult",
    "arpo_reward",
    "check_format",
    "exact_match",
    "extract_boxed",
    "f1_score",
    "get_reward",
    "math_equal",
    "normalize_answer",
    "normalize_math",
    "tags_balanced",
]
