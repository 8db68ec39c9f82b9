"""String-id registries of pluggable parts, imported lazily (gymnasium `register`/`make` style).

Every pluggable part (tools, rewards, task sources, algorithms, policy backends,
models, tool-call formats) has one `Registry`. A name a config gives resolves to:

1. an entry registered in code, `registry.register(name, obj_or_"module:attr")`:
   the built-in parts register themselves this way, exactly as a user's code may;
2. `"module:attr"` written in place of a name: imported on the spot;
3. an entry point of an installed package in the registry's group (e.g.
   `agentenv.tools`), read the first time a name is not found otherwise.

A string entry is imported on first use, so registering imports nothing and
`import agentenv` stays free of heavy backends. An unknown name suggests the
closest known ones; a plugin that fails to import names the plugin and the cause.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from agentenv.errors import ConfigError

T = TypeVar("T")
P = TypeVar("P", covariant=True)  # what a Part makes

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_import_path(name: Any) -> bool:
    """Whether `name` looks like `"package.module:attr"`."""
    return isinstance(name, str) and _IMPORT_PATH.fullmatch(name) is not None


def import_string(path: str) -> Any:
    """`"pkg.mod:attr"` (or `"pkg.mod:Class.attr"`) -> the attribute."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"entry point {path!r} must look like 'package.module:attribute'")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_import_path(path: str, key: str, what: str) -> Any:
    """`import_string`, with a failure turned into a ConfigError that names `what` and the cause."""
    try:
        return import_string(path)
    except Exception as e:  # noqa: BLE001 - a plugin may fail any way; say which and why
        raise ConfigError(key, f"{what} {path!r} failed to import: {type(e).__name__}: {e}") from e


@dataclasses.dataclass(frozen=True)
class _EntryPoint:
    """A name an installed package declares in a registry's entry-point group."""

    value: str
    dist: str


class Registry(Generic[T]):
    """Name -> part, with lazy import, `module:attr` names, entry points and closest-name suggestions.

    Args:
        kind: What the registry holds, for messages (e.g. `"tool"`).
        key: The config key that selects from it (e.g. `"env.tools"`).
        group: Entry-point group installed packages add parts through (e.g. `"agentenv.tools"`).
        adapt: `adapt(obj, key)` turns a loaded object into the part (and raises
            ConfigError when it is not one); default: the object as is.
    """

    def __init__(
        self, kind: str, key: str, group: str | None = None, adapt: Callable[[Any, str], T] | None = None
    ):
        self.kind = kind
        self.key = key
        self.group = group
        self._adapt = adapt
        self._entries: dict[str, Any] = {}
        self._loaded: dict[str, T] = {}
        self._scanned = group is None

    def register(self, name: str, entry: Any, *, overwrite: bool = False) -> None:
        """Register `entry` (the part, or a lazy `"module:attr"` string) under `name`."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"a {self.kind} name must be a non-empty string without ':', got {name!r}")
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        self._loaded.pop(name, None)

    def _scan(self) -> None:
        """Add the entry points of installed packages (once; a name registered in code wins)."""
        if self._scanned or self.group is None:  # no group: nothing to scan (`_scanned` starts True)
            return
        self._scanned = True
        for ep in metadata.entry_points(group=self.group):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
            self._entries.setdefault(ep.name, _EntryPoint(ep.value, dist))

    def names(self) -> list[str]:
        """Every known name (entry points of installed packages included)."""
        self._scan()
        return sorted(self._entries)

    def registered(self) -> list[str]:
        """The names registered in code so far, in registration order (no entry-point scan)."""
        return [n for n, e in self._entries.items() if not isinstance(e, _EntryPoint)]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self._entries:
            self._scan()
        return name in self._entries

    def get(self, name: str, key: str | None = None) -> T:
        """The part called `name` (a registered name, an entry point, or `module:attr`).

        Args:
            name: The name a config gives.
            key: The dotted config key, for errors (default: the registry's).

        Raises:
            ConfigError: Unknown name (with the closest known names), a plugin
                that fails to import (with the cause), or an object that is not a part.
        """
        key = key or self.key
        if name in self._loaded:
            return self._loaded[name]
        if is_import_path(name) and name not in self._entries:
            part = self._as_part(load_import_path(name, key, self.kind), key)
            self._loaded[name] = part
            return part
        if not isinstance(name, str) or name not in self:
            known = self.names()
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigError(
                key,
                f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(known)}; "
                "or give 'package.module:attr'",
            )
        entry = self._entries[name]
        if isinstance(entry, _EntryPoint):
            obj = load_import_path(entry.value, key, f"{self.kind} plugin {name!r} from {entry.dist}:")
        elif isinstance(entry, str):
            obj = load_import_path(entry, key, f"{self.kind} {name!r}:")
        else:
            obj = entry
        part = self._as_part(obj, key)
        self._loaded[name] = part
        return part

    def _as_part(self, obj: Any, key: str) -> T:
        return self._adapt(obj, key) if self._adapt is not None else obj


# --------------------------------------------------------------------------- parts with options
@runtime_checkable
class HasConfigClass(Protocol):
    """A factory (or class) that names the dataclass of its options: `config_cls` (or its `"module:attr"`)."""

    config_cls: Any


@dataclasses.dataclass(frozen=True)
class Part(Generic[P]):
    """A part as configs name it: `factory(config)` makes it (a `P`), `config_cls` validates its options.

    Either may be a `"module:attr"` string, imported on first use, so registering
    imports nothing. A factory without a config class takes its options as
    keyword arguments, checked against its signature.

    Attributes:
        factory: Makes the part from its validated config (or keyword options).
        config_cls: A dataclass of the part's options; None: keyword options.
    """

    factory: Any
    config_cls: Any = None

    def resolved(self, key: str) -> Part[P]:
        """The same part with its config class imported (the factory stays lazy: it may load torch or vLLM)."""
        cls = self.config_cls
        if isinstance(cls, str):
            cls = load_import_path(cls, key, "config class")
        if cls is not None and not dataclasses.is_dataclass(cls):
            raise ConfigError(key, f"config class {cls!r} is not a dataclass")
        factory = self.factory
        if cls is None and isinstance(factory, str):
            factory = load_import_path(factory, key, "factory")  # its signature checks the options
        if not isinstance(factory, str) and not callable(factory):
            raise ConfigError(key, f"{factory!r} is not callable")
        return Part[P](factory, cls)

    def config(self, options: Mapping[str, Any] | None, key: str, defaults: Mapping[str, Any] | None = None) -> Any:
        """The validated options: an instance of `config_cls`, or a checked keyword dict.

        Args:
            options: What the config gives (None: nothing).
            key: Dotted key of the options, for errors (`env.tools.search`).
            defaults: Options offered where `options` gives none (a task source's
                corpus, the run's seed); those the part does not take are left out.
        """
        from agentenv.loader import build_dataclass

        if options is not None and not isinstance(options, Mapping):
            raise ConfigError(key, f"expected a mapping of options, got {options!r}")
        takes = self._option_names()
        offered = {k: v for k, v in (defaults or {}).items() if takes is None or k in takes}
        merged = {**offered, **(options or {})}
        if self.config_cls is not None:
            return build_dataclass(self.config_cls, merged, key)
        return _check_kwargs(self.factory, merged, key)

    def _option_names(self) -> set[str] | None:
        """The options the part takes (None: any, a factory with **kwargs)."""
        if self.config_cls is not None:
            return {f.name for f in dataclasses.fields(self.config_cls) if f.init}
        try:
            params = inspect.signature(self.factory).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def make(self, config: Any, *args: Any, **kwargs: Any) -> P:
        """Call the factory with a config from `self.config` (and any runtime arguments)."""
        factory = self.factory
        if isinstance(factory, str):
            factory = import_string(factory)
        made: P = factory(config, *args, **kwargs) if self.config_cls is not None else factory(*args, **{**config, **kwargs})
        return made  # the registry's kind: its registered factories are typed to make a P


def _check_kwargs(factory: Any, options: dict[str, Any], key: str) -> dict[str, Any]:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return options
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return options
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for k in options:
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            takes = ", ".join(names) or "no options"
            raise ConfigError(f"{key}.{k}", f"unknown option{hint} ({getattr(factory, '__name__', factory)} takes {takes})")
    return options


def as_part(obj: Any, key: str) -> Part[Any]:
    """A `Part`, or a callable (its `config_cls` attribute, if any, is its config class), as a resolved Part."""
    if isinstance(obj, Part):
        return obj.resolved(key)
    if callable(obj):
        return Part(obj, obj.config_cls if isinstance(obj, HasConfigClass) else None).resolved(key)
    raise ConfigError(key, f"{obj!r} is neither a Part nor a callable factory")
