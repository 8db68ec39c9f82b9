"""Mappings (YAML sections, keyword options) -> validated config dataclasses.

The one loader every config class goes through: a run config's sections, each
part's own options (a tool's, a task source's, a policy backend's, an
algorithm's), the tiny model's build fields. Keys and types are checked against
the dataclass; every error is a `ConfigError` naming the dotted key and the bad
value, including the errors a class's `__post_init__` raises about its own fields.

A field marked `rest_field()` collects the keys the class does not declare: a
section that selects a part by name (`algorithm: {name: arpo, forks_per_branch: 3}`)
keeps the part's own options there, and the part's config class checks them.

Every number is checked here, by its annotation, for every config class alike
(a class's `__post_init__` adds the ranges that are its own): a value of an
`int` or `float` field (or inside a `list[float]`, a `float | None`, ...) must be
finite (`.nan`, `.inf` and a float past the largest double are refused, unless
the field is declared with `allow_nonfinite()`), an int must fit in 64 bits, and
a seed (a field named `seed` or `*_seed`) must be in [0, 2**32 - 1], what numpy,
torch and Python's `random` all take.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast, runtime_checkable

import yaml

from agentenv.errors import ConfigError

_REST = "agentenv.rest"
_NONFINITE_OK = "agentenv.nonfinite_ok"
_KEY = "agentenv.key"
SEED_RANGE = (0, 2**32 - 1)
"""Seeds numpy, torch and `random` all take."""
INT_RANGE = (-(2**63), 2**63 - 1)
"""Every other int: what fits a 64-bit integer (a tensor, a numpy array, a C size)."""
_FLOAT_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

_D = TypeVar("_D")


def rest_field() -> Any:
    """A `Mapping` field that receives every key the dataclass does not declare."""
    return dataclasses.field(default_factory=dict, metadata={_REST: True})


def keyed(key: str, default: Any) -> Any:
    """A field the config spells `key` (a Python keyword such as `class` cannot be a field's name)."""
    return dataclasses.field(default=default, metadata={_KEY: key})


def _key_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(_KEY, f.name))


def allow_nonfinite(default: float) -> Any:
    """A float field that may hold `.nan` or `.inf` (the loader refuses them everywhere else)."""
    return dataclasses.field(default=default, metadata={_NONFINITE_OK: True})


class _OutOfRange(ConfigError):
    """A number of the right type outside what its field can hold."""


def _is_seed(key: str) -> bool:
    name = key.rsplit(".", 1)[-1].split("[", 1)[0]
    return name == "seed" or name.endswith("_seed")


def _checked_int(value: int, key: str) -> int:
    lo, hi = SEED_RANGE if _is_seed(key) else INT_RANGE
    if not lo <= value <= hi:
        what = "a seed, an integer" if _is_seed(key) else "an integer"
        shown = repr(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit integer"
        raise _OutOfRange(key, f"must be {what} in [{lo}, {hi}], got {shown}")
    return value


def _checked_float(value: Any, key: str, nonfinite_ok: bool) -> float:
    try:
        number = float(value)
    except OverflowError:  # an int past the largest double
        raise _OutOfRange(key, f"must be a finite number, got a {len(str(abs(value)))}-digit integer") from None
    if not nonfinite_ok and not math.isfinite(number):
        raise _OutOfRange(key, f"must be a finite number, got {number!r}")
    return number


def check_number(key: str, value: Any, *, low: float = 0.0, low_ok: bool = False, integer: bool = False) -> None:
    """Raise a ConfigError naming `key` unless `value` is a finite number above `low` (or at it, with `low_ok`).

    For a config class's `__post_init__`: NaN and infinity pass every comparison
    they should fail (`nan < 0` is False), so a bare `v <= 0` check lets them in.
    """
    kind = "an int" if integer else "a finite number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    bound = f">= {low:g}" if low_ok else f"> {low:g}"
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not (value >= low if low_ok else value > low):
        raise ConfigError(key, f"must be {kind} {bound}, got {value!r}")


def _rest_name(cls: type) -> str | None:
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get(_REST)), None)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, nonfinite_ok: bool = False) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        out_of_range: _OutOfRange | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, nonfinite_ok)
            except _OutOfRange as e:  # the right kind of value: say what is wrong with it, not "expected ..."
                out_of_range = out_of_range or e
            except ConfigError:
                continue
        if out_of_range is not None:
            raise out_of_range
        raise ConfigError(key, f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return build_dataclass(cast(type, tp), value, key)  # a type here: is_dataclass also admits instances
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]", nonfinite_ok) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin in (dict, collections.abc.Mapping) or tp in (dict, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return _checked_int(value, key)
    if tp is float:
        if isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
            value = value.strip()  # YAML 1.1 reads `5e-5` (no dot) as a string
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return _checked_float(value, key, nonfinite_ok)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    return value


def _rekey(e: ConfigError, cls: type, prefix: str) -> ConfigError:
    """An error `cls.__post_init__` raised about one of its fields, under `prefix`.

    A config class names its own keys (`search.k`); built as a section of
    something larger it is reported where the user wrote it (`env.tools.search.k`).
    """
    if not prefix or e.key == prefix or e.key.startswith(prefix + "."):
        return e
    names = {f.name for f in dataclasses.fields(cls)}
    parts = e.key.split(".")
    for i in range(len(parts)):
        if parts[i] in names:
            return ConfigError(".".join([prefix, *parts[i:]]), e.message)
    return e


@runtime_checkable
class RenamesKeys(Protocol):
    """A config class that says what its old keys became (`renamed_keys`: old key -> the new key, in words)."""

    renamed_keys: ClassVar[dict[str, str]]


@runtime_checkable
class FixesKeys(Protocol):
    """A config class that fixes some keys to one value (`fixed_keys`: key -> why, in words)."""

    fixed_keys: ClassVar[dict[str, str]]


def build_dataclass(cls: type[_D], data: Any, prefix: str) -> _D:
    """Build `cls` from a mapping, checking keys and types; errors name `prefix.key`.

    Args:
        cls: A dataclass.
        data: A mapping of its fields, an instance of `cls` (returned as is), or None (the defaults).
        prefix: The dotted key of `data` in the config the user wrote (`""` at the top).

    Raises:
        ConfigError: An unknown key (with the closest known one, or for a key
            in the class's `renamed_keys` mapping, what it became), a key in its
            `fixed_keys` mapping given another value than the one the class fixes,
            a value of the wrong type, or what `cls` itself rejects, named by its dotted key.

    A class's `fixed_keys` maps a key of related classes that it does not take
    to why (a variant that fixes what its family lets others choose): given the
    value of the class attribute of that name, the key is accepted and ignored
    (it asks for what the class does); any other value, or any value where the
    class has no such attribute, is refused with the reason.
    """
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, collections.abc.Mapping):
        raise ConfigError(prefix or cls.__name__, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {_key_of(f): f for f in dataclasses.fields(cast(Any, cls)) if f.init}  # `cls` is a dataclass (the contract)
    names = list(fields)
    rest = _rest_name(cls)
    renamed: dict[str, str] = cls.renamed_keys if isinstance(cls, RenamesKeys) else {}  # old key -> what it became
    fixed: dict[str, str] = cls.fixed_keys if isinstance(cls, FixesKeys) else {}  # key the class does not take -> why
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key == rest or key not in names:
            if rest is not None:
                extra[key] = value
                continue
            if key in renamed:
                raise ConfigError(full, f"was renamed (value {value!r}): {full} {renamed[key]}")
            if key in fixed:
                if hasattr(cls, key) and value == getattr(cls, key):
                    continue  # what the class does anyway
                at = f"is fixed at {getattr(cls, key)!r} for" if hasattr(cls, key) else "is not a setting of"
                raise ConfigError(full, f"{at} this algorithm, got {value!r}: {fixed[key]}; leave the key out")
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(full, f"unknown key (value {value!r}){hint} Known keys: {', '.join(names)}")
        name = fields[key].name
        kwargs[name] = _coerce(value, hints[name], full, bool(fields[key].metadata.get(_NONFINITE_OK)))
    if rest is not None:
        kwargs[rest] = extra
    for f in dataclasses.fields(cast(Any, cls)):
        required = f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in kwargs:
            raise ConfigError(f"{prefix}.{_key_of(f)}" if prefix else _key_of(f), "is required")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise _rekey(e, cls, prefix) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(prefix or cls.__name__, str(e)) from e


def dump_dataclass(obj: Any) -> Any:
    """The plain mapping `build_dataclass` reads back into an equal object (rest fields flattened)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        rest = _rest_name(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == rest:
                out.update({k: dump_dataclass(v) for k, v in value.items()})
            else:
                out[_key_of(f)] = dump_dataclass(value)
        return out
    if isinstance(obj, collections.abc.Mapping):
        return {k: dump_dataclass(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [dump_dataclass(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- dotted overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], parsed value); values are YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like dotted.key=value")
    key, _, raw = text.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(text, "an override must look like dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(key, f"cannot parse value {raw!r}: {e}") from e
    return parts, value


def field_overrides(items: list[str]) -> dict[str, Any]:
    """`["sft_steps=200", ...]` -> `{"sft_steps": 200}`: flat `field=value` overrides (YAML values)."""
    out: dict[str, Any] = {}
    for text in items:
        parts, value = parse_override(text)
        if len(parts) != 1:
            raise ConfigError(text, "an override here names one field: field=value")
        out[parts[0]] = value
    return out


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a nested mapping (a deep copy is returned).

    A list of names given for a key that holds a mapping keeps those entries
    with their values: `env.tools=[search]` drops every other tool but keeps
    the search tool's options.
    """
    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(".".join(parts), f"cannot set a key inside {p!r}, which is {nxt!r}")
            node = nxt
        old = node.get(parts[-1])
        if isinstance(old, dict) and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = {k: old.get(k) for k in value}
        node[parts[-1]] = value
    return out
