"""The `tiny` model: `model.path: tiny` builds the embedded model once, then finds it in the cache."""

from __future__ import annotations

from typing import Any


class TinyModel:
    """The embedded tiny model as a model part (see `agentenv.policies.models`)."""

    def path(self) -> str:
        """The cached build's folder (built first if needed: a few minutes on a CPU)."""
        from agentenv.toy.tiny import ensure_tiny_model

        return str(ensure_tiny_model())

    def tokenizer(self) -> Any:
        """The tokenizer alone (trained in seconds when the model is not built yet)."""
        from agentenv.toy.tiny import load_tiny_tokenizer

        return load_tiny_tokenizer()


TINY = TinyModel()
