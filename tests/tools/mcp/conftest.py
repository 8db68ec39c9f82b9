import pytest

from agentenv.envs.testing import build_test_tokenizer


@pytest.fixture(scope="session")
def tok():
    return build_test_tokenizer()
