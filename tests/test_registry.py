"""Registries: names, `module:attr`, entry points of installed packages, suggestions, parts with options."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import pytest

from agentenv.errors import ConfigError
from agentenv.registry import Part, Registry, as_part, is_import_path


@dataclass(frozen=True)
class Opts:
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError("thing.size", f"must be >= 1, got {self.size}")


def make_thing(cfg: Opts) -> tuple[str, int]:
    return ("thing", cfg.size)


def plain(a: int, b: str = "x") -> tuple[int, str]:
    return (a, b)


def test_names_module_attr_and_suggestions():
    reg: Registry[Part] = Registry("widget", "parts.widget", adapt=as_part)
    reg.register("thing", Part(f"{__name__}:make_thing", f"{__name__}:Opts"))
    reg.register("thin", Part(make_thing, Opts))
    with pytest.raises(ValueError, match="already registered"):
        reg.register("thing", make_thing)
    part = reg.get("thing")
    assert part.config_cls is Opts and isinstance(part.factory, str)  # the factory stays lazy
    assert part.make(part.config({"size": 3}, "w")) == ("thing", 3)
    assert reg.get(f"{__name__}:make_thing").factory is make_thing  # module:attr, no registration
    with pytest.raises(ConfigError, match=r"parts\.widget: unknown widget 'thnig'\. Did you mean 'thing', 'thin'\?"):
        reg.get("thnig")
    with pytest.raises(ConfigError, match=r"k: widget 'nope_mod:x' failed to import: ModuleNotFoundError"):
        reg.get("nope_mod:x", "k")
    assert is_import_path("a.b:c") and not is_import_path("tiny") and not is_import_path("Qwen/Qwen2.5-7B")


def test_part_options_are_checked_with_dotted_keys():
    part = as_part(Part(make_thing, Opts), "k")
    with pytest.raises(ConfigError, match=r"env\.tools\.thing\.sise: unknown key .*did you mean 'size'"):
        part.config({"sise": 2}, "env.tools.thing")
    with pytest.raises(ConfigError, match=r"env\.tools\.thing\.size: must be >= 1, got 0"):
        part.config({"size": 0}, "env.tools.thing")  # the class's own error, under the key the user wrote
    assert part.config(None, "k", defaults={"size": 5}) == Opts(5)
    assert part.config({"size": 2}, "k", defaults={"size": 5}) == Opts(2)
    kw = as_part(plain, "k")  # no config class: keyword options, checked against the signature
    assert kw.make(kw.config({"a": 1}, "k")) == (1, "x")
    with pytest.raises(ConfigError, match=r"opts\.c: unknown option .*plain takes a, b"):
        kw.config({"a": 1, "c": 2}, "opts")


def test_entry_points_of_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "wplug.py").write_text("def big(size=1):\n    return ('big', size)\n")
    dist = tmp_path / "wplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[agentenv.test_widgets]\nbig = wplug:big\nthing = wplug:big\nbroken = wplug_missing:big\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    reg: Registry[Part] = Registry("widget", "parts.widget", group="agentenv.test_widgets", adapt=as_part)
    reg.register("thing", make_thing)
    assert reg.names() == ["big", "broken", "thing"] and reg.registered() == ["thing"]
    big = reg.get("big")
    assert big.make(big.config({"size": 2}, "k")) == ("big", 2)
    assert reg.get("thing").factory is make_thing  # a name registered in code wins
    with pytest.raises(ConfigError) as e:
        reg.get("broken")
    assert str(e.value).startswith(
        "parts.widget: widget plugin 'broken' from wplug: 'wplug_missing:big' failed to import: ModuleNotFoundError"
    )
    with pytest.raises(ConfigError, match="Did you mean 'big'"):
        reg.get("bgi")
    sys.modules.pop("wplug", None)


def test_an_object_that_is_not_an_algorithm_says_what_it_lacks():
    from agentenv.algorithms import get_algorithm

    with pytest.raises(ConfigError, match=r"algorithm\.name: .* is not an algorithm: it lacks config_cls, sampler"):
        get_algorithm(f"{__name__}:make_thing")
    assert get_algorithm("agentenv.algorithms.grpo:GRPO") is get_algorithm("grpo")
