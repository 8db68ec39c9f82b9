"""Tool calls and tool failures counted over trajectories, so that a failing tool never passes silently.

Every failed call carries a `ToolResult.kind` (`agentenv.types.ToolErrorKind`);
the env counts them per tool in `Trajectory.tool_errors`. A call *failed* when
its kind is one of `TOOL_FAULT_KINDS`: the tool did not do its job (a timeout,
a sandbox that could not run the code, an HTTP error, a refused input). Code
that ran and raised (`agent`) is the agent's mistake and is counted, but is no
failure of the tool.

Trees (ARPO) copy a shared prefix's calls into every branch, so their counts
weigh a prefix once per branch, calls and failures alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agentenv.types import TOOL_ERROR_KINDS, TOOL_FAULT_KINDS, Trajectory

WARN_SHARE = 0.2
"""Warn when more than this share of one tool's calls failed in an evaluation or a step."""


@dataclass
class ToolStats:
    """Calls and failed calls per tool.

    Attributes:
        calls: Tool name -> calls made.
        errors: Tool name -> `ToolResult.kind` -> calls that failed so.
        examples: `"tool/kind"` -> the text of one such error (for the warning line).
    """

    calls: Counter[str] = field(default_factory=Counter)
    errors: dict[str, Counter[str]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> ToolStats:
        stats = cls()
        for t in trajectories:
            for name, n in t.tool_calls.items():
                if name != "invalid":
                    stats.calls[name] += n
            for name, kinds in t.tool_errors.items():
                stats.errors.setdefault(name, Counter()).update(kinds)
            for key, text in t.info.get("tool_error_text", {}).items():
                stats.examples.setdefault(key, text)
        return stats

    def failures(self, tool: str) -> int:
        """Calls of `tool` that failed for a reason other than the agent's own code."""
        kinds = self.errors.get(tool, Counter())
        return sum(kinds[k] for k in TOOL_FAULT_KINDS)

    def failure_share(self, tool: str) -> float:
        return self.failures(tool) / self.calls[tool] if self.calls[tool] else 0.0

    def commonest(self, tool: str) -> tuple[str, int, str] | None:
        """The commonest failure kind of `tool`, its count, and one such error's text."""
        kinds = {k: n for k, n in self.errors.get(tool, Counter()).items() if k in TOOL_FAULT_KINDS and n}
        if not kinds:
            return None
        kind = max(kinds, key=lambda k: (kinds[k], k))
        return kind, kinds[kind], self.examples.get(f"{tool}/{kind}", "")

    def counts(self, tools: Sequence[str]) -> dict[str, float]:
        """Fixed keys for `tools` (the same on every process, so they can be summed across processes)."""
        out: dict[str, float] = {}
        for tool in tools:
            out[f"tool_calls/{tool}"] = float(self.calls[tool])
            for kind in TOOL_ERROR_KINDS:
                out[f"tool_errors/{tool}/{kind}"] = float(self.errors.get(tool, Counter())[kind])
        return out

    @classmethod
    def from_counts(cls, counts: dict[str, float], examples: dict[str, str] | None = None) -> ToolStats:
        """The inverse of `counts` (after a sum across processes)."""
        stats = cls(examples=dict(examples or {}))
        for key, value in counts.items():
            parts = key.split("/")
            if parts[0] == "tool_calls" and len(parts) == 2:
                stats.calls[parts[1]] += int(value)
            elif parts[0] == "tool_errors" and len(parts) == 3 and value:
                stats.errors.setdefault(parts[1], Counter())[parts[2]] += int(value)
        return stats

    def metrics(self, prefix: str, tools: Sequence[str] | None = None) -> dict[str, float]:
        """`{prefix}tool_calls/T`, `{prefix}tool_errors/T/KIND` and `{prefix}tool_failed/T` (the failed share)."""
        names = list(tools) if tools is not None else sorted(set(self.calls) | set(self.errors))
        out = {f"{prefix}{k}": v for k, v in self.counts(names).items()}
        out.update({f"{prefix}tool_failed/{t}": self.failure_share(t) for t in names})
        return out

    def warnings(self, where: str, share: float = WARN_SHARE) -> list[str]:
        """One line per tool whose calls failed more often than `share` (`where`: "in the evaluation at step 0")."""
        lines = []
        for tool in sorted(self.calls):
            if self.calls[tool] and self.failure_share(tool) > share:
                common = self.commonest(tool)
                assert common is not None
                kind, n, text = common
                lines.append(
                    f"the {tool} tool failed {self.failures(tool)} of {self.calls[tool]} calls "
                    f"({self.failure_share(tool):.0%}) {where}; commonest: {kind} ({n} calls)"
                    + (f": {text}" if text else "")
                )
        return lines

    def as_dict(self) -> dict[str, object]:
        """For the eval JSON: calls, errors by kind and the failed share per tool."""
        return {
            tool: {
                "calls": self.calls[tool],
                "errors": dict(sorted(self.errors.get(tool, Counter()).items())),
                "failed_share": round(self.failure_share(tool), 4),
            }
            for tool in sorted(set(self.calls) | set(self.errors))
        }
