"""Shared fixtures: the tiny model is built once per machine and cached."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path():
    """Path of the embedded tiny model (built on first use, then cached)."""
    from agentenv.toy.tiny import ensure_tiny_model

    return ensure_tiny_model()
