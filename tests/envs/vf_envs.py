"""verifiers environments written by a user (the verifiers API, nothing of agentenv): a SingleTurnEnv and a ToolEnv.

    env: {class: verifiers, options: {environment: vf_envs:arith_env, args: {n: 8}}}
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def _rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + {i % 3 + 1}? Answer with the number.", "answer": str(i + i % 3 + 1)}
            for i in range(n)]  # fmt: skip


def _last_text(completion) -> str:
    return str(completion[-1].get("content") or "") if completion else ""


def correct(completion, answer, **kwargs) -> float:
    """1 when the final message holds the answer."""
    return 1.0 if answer in _last_text(completion) else 0.0


def brief(completion, **kwargs) -> float:
    """1 for a final message under 40 characters."""
    return 1.0 if len(_last_text(completion)) < 40 else 0.0


def arith_env(n: int = 8) -> vf.Environment:
    """One question, one answer; the rubric weighs correctness 1 and brevity 0.5."""
    return vf.SingleTurnEnv(dataset=Dataset.from_list(_rows(n)), eval_dataset=Dataset.from_list(_rows(n + 4)[n:]),
                            rubric=vf.Rubric(funcs=[correct, brief], weights=[1.0, 0.5]))  # fmt: skip


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def add_tool_env(n: int = 8, max_turns: int = 3) -> vf.Environment:
    """The same questions with an `add` tool the model may call (hermes-style calls, parsed by the endpoint)."""
    return vf.ToolEnv(tools=[add], max_turns=max_turns, dataset=Dataset.from_list(_rows(n)),
                      rubric=vf.Rubric(funcs=[correct], weights=[1.0]))  # fmt: skip


def broken_env(**kwargs) -> vf.Environment:
    raise RuntimeError("the dataset server is down")


class FlakyEnv(vf.SingleTurnEnv):
    """Its rollout raises on every second call: one episode fails mid-way, the others must not."""

    calls = 0

    async def rollout(self, *args, **kwargs):
        FlakyEnv.calls += 1
        if FlakyEnv.calls % 2 == 0:
            raise RuntimeError("the environment's sandbox died")
        return await super().rollout(*args, **kwargs)


def flaky_env(n: int = 8) -> vf.Environment:
    return FlakyEnv(dataset=Dataset.from_list(_rows(n)), rubric=vf.Rubric(funcs=[correct], weights=[1.0]))
