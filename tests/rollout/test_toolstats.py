"""Tool calls and failures counted per tool and kind, the warning line, and the sums across processes."""

from __future__ import annotations

import pytest

from agentenv.rollout.toolstats import ToolStats
from agentenv.types import ToolResult, Trajectory


def traj(calls: dict[str, int], errors: dict[str, dict[str, int]], texts: dict[str, str] | None = None) -> Trajectory:
    return Trajectory(task_id="t", tool_calls=calls, tool_errors=errors, info={"tool_error_text": texts or {}})


def test_a_failed_result_always_has_a_kind_and_an_ok_one_none():
    assert ToolResult(text="x").kind is None
    assert ToolResult(text="x", kind="timeout").kind is None  # ok wins: a kind means a failure
    assert ToolResult(text="", ok=False).kind == "error"
    assert ToolResult(text="", ok=False, kind="sandbox").kind == "sandbox"
    with pytest.raises(ValueError, match="kind must be one of"):
        ToolResult(text="", ok=False, kind="oops")  # type: ignore[arg-type]  # the check under test


def test_counts_failures_but_not_the_agents_own_errors():
    stats = ToolStats.of(
        [
            traj({"python": 3, "invalid": 2}, {"python": {"timeout": 2, "agent": 1}}, {"python/timeout": "timeout after 5 s"}),
            traj({"python": 2, "search": 4}, {"python": {"timeout": 1}, "search": {"refused": 1}}),
        ]
    )
    assert stats.calls == {"python": 5, "search": 4}  # malformed calls (`invalid`) are no tool's calls
    assert stats.failures("python") == 3 and stats.failure_share("python") == pytest.approx(0.6)
    assert stats.failure_share("search") == pytest.approx(0.25)
    assert stats.commonest("python") == ("timeout", 3, "timeout after 5 s")
    m = stats.metrics("eval/", ["python", "search"])
    assert m["eval/tool_errors/python/timeout"] == 3 and m["eval/tool_errors/python/agent"] == 1
    assert m["eval/tool_calls/search"] == 4 and m["eval/tool_failed/python"] == pytest.approx(0.6)
    assert stats.as_dict()["python"] == {"calls": 5, "errors": {"agent": 1, "timeout": 3}, "failed_share": 0.6}


def test_warns_once_per_tool_past_a_fifth_naming_its_commonest_error():
    stats = ToolStats.of(
        [traj({"python": 10, "search": 10}, {"python": {"sandbox": 3}, "search": {"http": 2}}, {"python/sandbox": "no hello"})]
    )
    lines = stats.warnings("in the evaluation at step 0")
    assert lines == [
        "the python tool failed 3 of 10 calls (30%) in the evaluation at step 0; commonest: sandbox (3 calls): no hello"
    ]  # search failed 20%: not more than a fifth
    only_agent = ToolStats.of([traj({"python": 4}, {"python": {"agent": 4}})])
    assert only_agent.warnings("in step 1") == []  # code that raised is the agent's mistake, not the tool's


def test_counts_survive_a_sum_across_processes():
    a = ToolStats.of([traj({"python": 2}, {"python": {"timeout": 1}})])
    b = ToolStats.of([traj({"python": 3, "search": 1}, {"python": {"timeout": 2}})])
    tools = ["python", "search"]
    ka, kb = a.counts(tools), b.counts(tools)
    assert ka.keys() == kb.keys()  # fixed keys: each process sends the same vector
    total = ToolStats.from_counts({k: ka[k] + kb[k] for k in ka})
    assert total.calls == {"python": 5, "search": 1} and total.failures("python") == 3
