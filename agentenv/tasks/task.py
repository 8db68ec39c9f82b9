"""The Task record: one question an episode tries to answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Ability = Literal["math", "qa"]


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        id: Unique id within its dataset.
        messages: Chat messages (`{"role": ..., "content": ...}`), system prompt
            first where there is one, then the user question.
        ground_truth: The reference answer (a string; several acceptable answers
            may be joined in a list in `metadata["answers"]`).
        ability: `math` (checked by exact or symbolic equality) or `qa`
            (checked by token-level F1).
        metadata: Source, split, toy-task kind, anything else.
    """

    id: str
    messages: tuple[dict[str, str], ...]
    ground_truth: str
    ability: Ability = "qa"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.ability not in ("math", "qa"):
            raise ValueError(f"Task.ability must be 'math' or 'qa', got {self.ability!r} (task {self.id})")
        msgs = tuple(dict(m) for m in self.messages)
        for m in msgs:
            if "role" not in m or "content" not in m:
                raise ValueError(f"Task {self.id}: every message needs 'role' and 'content', got {m!r}")
        object.__setattr__(self, "messages", msgs)

    @property
    def question(self) -> str:
        """The last user message."""
        for m in reversed(self.messages):
            if m["role"] == "user":
                return m["content"]
        return ""


def balanced_subset(tasks: Sequence[Task], n: int | None) -> list[Task]:
    """At most `n` tasks taken round-robin over their kinds, each kind in its own order.

    The kind is `metadata["kind"]` (toy tasks) or else the ability. A held-out
    list grouped by kind would otherwise be evaluated on its first kinds only.
    `n=None` keeps every task.
    """
    if n is None or n >= len(tasks):
        return list(tasks)
    by_kind: dict[str, list[Task]] = {}
    for t in tasks:
        by_kind.setdefault(str(t.metadata.get("kind", t.ability)), []).append(t)
    queues = [iter(q) for q in by_kind.values()]
    out: list[Task] = []
    while len(out) < n:
        for q in queues:
            nxt = next(q, None)
            if nxt is not None and len(out) < n:
                out.append(nxt)
    return out
