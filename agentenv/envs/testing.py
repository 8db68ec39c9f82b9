"""Small real parts for testing envs, the rollout and samplers without a model download.

- `build_test_tokenizer()`: a byte-level BPE trained in a few milliseconds on
  tool-use sentences, wrapped as `transformers.PreTrainedTokenizerFast` with a
  ChatML chat template and EOS `<|im_end|>`.
- Tools: `EchoTool`, `SleepTool`, `FailingTool` (raises `ToolError`), and
  `CounterTool` (stateful: a fork keeps the count, then diverges).
- `boxed_reward`: a stand-in reward with ARPO's shape (-1 format, 1 correct, 0 wrong).
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import Any

from agentenv.errors import ToolError
from agentenv.tasks.task import Task
from agentenv.types import ToolResult, turns_of

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "<think>I should search for the capital.</think><search>capital of Norvex</search>",
    "<result>\nPage 1: Norvex\nThe capital of Norvex is Quenby.\n</result>",
    "<think>Compute it.</think><python>print(4821 * 917)</python>",
    "<answer>The final answer is \\boxed{42}</answer>",
    "You are a helpful assistant. Solve the question step by step.",
    "What is the population of Quenby times 3? Who founded Norvex Labs?",
    "Error: Unknown tag. Available tools: search, python. Tool-call limit reached.",
    "echo count hello world test done sleep fail the a of in is to and",
]


@functools.lru_cache(maxsize=1)
def build_test_tokenizer() -> Any:
    """A small byte-level BPE tokenizer with ChatML, trained offline (vocab ~600)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


class EchoTool:
    """Stateless: answers `echo: <query>` (fork returns itself)."""

    def __init__(self, name: str = "search", repeat: int = 1):
        self.name = name
        self.repeat = repeat
        self.calls: list[str] = []

    async def __call__(self, query: str) -> ToolResult:
        self.calls.append(query)
        if not query.strip():
            return ToolResult(text="", ok=False, error="empty query", kind="refused")
        return ToolResult(text=" ".join([f"echo: {query}"] * self.repeat))

    def fork(self) -> EchoTool:
        return self

    async def aclose(self) -> None:
        return None


class SleepTool:
    """Sleeps `delay_s` (without blocking the loop), then answers `slept <query>`."""

    def __init__(self, name: str = "sleep", delay_s: float = 1.0):
        self.name = name
        self.delay_s = delay_s

    async def __call__(self, query: str) -> ToolResult:
        await asyncio.sleep(self.delay_s)
        return ToolResult(text=f"slept {query}", latency_s=self.delay_s)

    def fork(self) -> SleepTool:
        return self

    async def aclose(self) -> None:
        return None


class FailingTool:
    """Its infrastructure is always broken: raises `ToolError`."""

    def __init__(self, name: str = "search"):
        self.name = name

    async def __call__(self, query: str) -> ToolResult:
        raise ToolError(f"{self.name} backend unreachable (test tool: always fails)")

    def fork(self) -> FailingTool:
        return self

    async def aclose(self) -> None:
        return None


class CounterTool:
    """Stateful: every call adds one and answers `count=N`. A fork copies the count.

    Attributes:
        count: Calls so far in this session.
        closed: Whether `aclose` ran.
        forks: Every fork made from this tool (and their forks register here too).
    """

    def __init__(self, name: str = "python", count: int = 0, registry: list[Any] | None = None):
        self.name = name
        self.count = count
        self.closed = False
        self.forks: list[CounterTool] = registry if registry is not None else []

    async def __call__(self, query: str) -> ToolResult:
        if self.closed:
            raise ToolError("CounterTool used after aclose()")
        self.count += 1
        return ToolResult(text=f"count={self.count}")

    def fork(self) -> CounterTool:
        new = CounterTool(self.name, self.count, self.forks)
        self.forks.append(new)
        return new

    async def aclose(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class RewardResult:
    score: float
    correct: bool
    format_ok: bool


def boxed_reward(response: str, task: Task, tool_calls: dict[str, int]) -> RewardResult:
    """-1 without `<answer>...\\boxed{}...</answer>` in one turn; else 1 if the boxed value is the ground truth, 0 if not."""
    found = (re.search(r"<answer>.*?\\boxed\{([^}]*)\}.*?</answer>", turn, re.S) for turn in turns_of(response))
    m = next((m for m in found if m is not None), None)
    if m is None:
        return RewardResult(-1.0, False, False)
    correct = m.group(1).strip() == task.ground_truth.strip()
    return RewardResult(1.0 if correct else 0.0, correct, True)


def make_task(question: str = "What is 6 * 7?", answer: str = "42", task_id: str = "t0") -> Task:
    """A one-question task with a short system prompt."""
    return Task(
        id=task_id,
        messages=({"role": "system", "content": "Solve it."}, {"role": "user", "content": question}),
        ground_truth=answer,
        ability="math",
    )
