"""Fixtures for env tests: a real tokenizer trained offline, small real tools."""

import pytest

from agentenv.envs.testing import build_test_tokenizer, make_task


@pytest.fixture(scope="session")
def tok():
    return build_test_tokenizer()


@pytest.fixture
def task():
    return make_task()


@pytest.fixture
def enc(tok):
    def _enc(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    return _enc
