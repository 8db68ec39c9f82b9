"""String-id registries, imported lazily (gymnasium `register`/`make` style).

An entry is either an object or a `"module.path:attr"` string that is imported
on first use, so `import agentenv` stays free of heavy backends.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Generic, TypeVar

from agentenv.errors import ConfigError

T = TypeVar("T")


def import_string(path: str) -> Any:
    """`"pkg.mod:attr"` -> the attribute."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"entry point {path!r} must look like 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


class Registry(Generic[T]):
    """Name -> entry, with lazy import and closest-name suggestions."""

    def __init__(self, kind: str, key: str):
        self.kind = kind  # e.g. "algorithm"
        self.key = key  # config key that selects from it, e.g. "algorithm.name"
        self._entries: dict[str, Any] = {}

    def register(self, name: str, entry: T | str, *, overwrite: bool = False) -> None:
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        if name not in self._entries:
            close = difflib.get_close_matches(name, self.names(), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigError(self.key, f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(self.names())}")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_string(entry)
            self._entries[name] = entry
        return entry
