"""A user's own parts, outside agentenv: a tool, a task source and a reward, named in configs as `module:attr`.

The tool speaks the `python` tag (the tiny model writes `<python>print(a * b)</python>`)
but is not agentenv's sandbox: it evaluates one arithmetic `print(...)` and logs each
query, so a test can see it was called with the options the config gave.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass

from agentenv.tasks.sources import TaskSet
from agentenv.tasks.task import Task
from agentenv.toy.tasks import TOY_SYSTEM_PROMPT
from agentenv.types import ToolResult

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only + - * of integers")


@dataclass(frozen=True)
class CalcConfig:
    """Options of the calculator tool.

    Attributes:
        log: A file each query is appended to (None: no log).
        prefix: Text put before every answer.
    """

    log: str | None = None
    prefix: str = ""


class Calculator:
    """`<python>print(6 * 7)</python>` -> `42`; anything else is an error the model reads."""

    name = "python"
    config_cls = CalcConfig

    def __init__(self, config: CalcConfig):
        self.config = config

    async def __call__(self, query: str) -> ToolResult:
        if self.config.log:
            with open(self.config.log, "a") as f:
                f.write(query.replace("\n", " ") + "\n")
        m = re.fullmatch(r"\s*print\((.*)\)\s*", query, flags=re.DOTALL)
        try:
            value = _eval(ast.parse(m[1] if m else query, mode="eval").body)
        except (SyntaxError, ValueError) as e:
            return ToolResult(text="", ok=False, error=f"cannot evaluate: {e}")
        return ToolResult(text=f"{self.config.prefix}{value}")

    def fork(self) -> Calculator:
        return self

    async def aclose(self) -> None:
        pass


@dataclass(frozen=True)
class ProductsConfig:
    """Options of the products task source.

    Attributes:
        n: Training tasks (and as many held-out ones).
        seed: Seed of the operands.
    """

    n: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


def products(cfg: ProductsConfig) -> TaskSet:
    """`What is a * b?` tasks in the toy prompt (the tiny model answers them with its python tool)."""
    rng = random.Random(cfg.seed)

    def task(split: str, i: int) -> Task:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        question = f"What is {a} * {b}?"
        return Task(
            id=f"products-{split}-{i}",
            messages=({"role": "system", "content": TOY_SYSTEM_PROMPT}, {"role": "user", "content": question}),
            ground_truth=str(a * b),
            ability="math",
            metadata={"kind": "products"},
        )

    return TaskSet([task("train", i) for i in range(cfg.n)], [task("heldout", i) for i in range(cfg.n)])


products.config_cls = ProductsConfig  # type: ignore[attr-defined]


def boxed_equal(response: str, task: Task, tool_calls: dict[str, int]) -> tuple[float, bool]:
    """1 for the right number in `\\boxed{}`, 0.5 for a wrong number after a tool call, else 0 (never negative)."""
    m = re.findall(r"\\boxed\{([^{}]*)\}", response)
    correct = bool(m) and m[-1].strip() == task.ground_truth
    if correct:
        return 1.0, True
    return (0.5 if tool_calls.get("python", 0) else 0.0), False
