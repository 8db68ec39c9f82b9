"""A small, fast run config for trainer tests (tiny model, toy search tasks)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from agentenv.configs import RunConfig, config_from_dict

FAST = [
    "policy.backend=hf",  # the toy configs default to vllm; tests/training/test_vllm_backend.py covers it
    "env.tools=[search]",
    "env.tasks.kinds=[twohop]",
    "env.max_context_tokens=768",
    "env.max_result_tokens=160",
    "policy.max_turn_tokens=48",
    "algorithm.group_size=2",
    "trainer.steps=2",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=4",
    "trainer.lr=0.001",
    "trainer.eval_tasks=2",
    "trainer.checkpoint_every=1",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.fixture
def fast_overrides(tmp_path, tiny_model_path):
    return FAST + [f"trainer.output_dir={tmp_path / 'run'}"]


@pytest.fixture
def fast_config(fast_overrides) -> RunConfig:
    return config_from_dict({}, fast_overrides)


@pytest.fixture(scope="module")
def fast_module_overrides(tmp_path_factory, tiny_model_path):
    """`FAST` with an output folder shared by one test module (for runs made once and reused)."""
    return FAST + [f"trainer.output_dir={tmp_path_factory.mktemp('run') / 'run'}"]


def python_cmd(script: Path, *args: str, nproc: int = 1) -> list[str]:
    """`script args` in one process, or under torchrun on `nproc` CPU processes (gloo, a free port on 127.0.0.1)."""
    if nproc == 1:
        return [sys.executable, str(script), *args]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(port), str(script), *args,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def launch_cmd():
    """The command that runs a script on n processes (`python_cmd`)."""
    return python_cmd
