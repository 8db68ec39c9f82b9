"""A small, fast run config for trainer tests (tiny model, toy search tasks)."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

from agentenv.configs import RunConfig, config_from_dict

FAST = [
    "policy.backend=hf",  # the toy configs default to vllm; tests/training/test_first_run.py runs them on it
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


def python_cmd(script: Path, *args: str, nproc: int = 1, torchrun: bool = False) -> list[str]:
    """`script args` in one process, or under torchrun (always with `torchrun`) on `nproc` processes (gloo on
    CPUs, NCCL on GPUs; a free port on 127.0.0.1)."""
    if nproc == 1 and not torchrun:
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


@pytest.fixture(scope="session")
def script_module():
    """Imports a script of this folder (a `*_run.py` that torchrun also runs) by name, as a module."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def run_ranks():
    """Runs `script.py RUN.yaml OUT` on `nproc` processes with the run config `cfg`; returns each rank's
    `OUT/rank{r}.pt` (what the script saved). A failed launch fails the test with its output."""

    def run(script: str, cfg: RunConfig, out: Path, nproc: int = 2) -> list:
        import subprocess

        import torch
        import yaml

        here = Path(__file__).resolve().parent
        cfg_file = out / "run.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
        cmd = python_cmd(here / script, str(cfg_file), str(out), nproc=nproc)
        proc = subprocess.run(cmd, cwd=here.parents[1], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]

    return run


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's parent links)."""
    import contextlib

    parent = {}
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [c for c, p in parent.items() if p == here]
        out += kids
        todo += kids
    return out


def kill_when(cmd: list[str], ready, what: str, timeout: float = 600.0, env: dict | None = None) -> None:
    """Run `cmd` (from the repository, in a session of its own) until `ready()` holds, then SIGKILL it and every
    process below it: torchrun starts each worker in a session of its own, and a killed launcher alone leaves them
    waiting in gloo for its 30-minute timeout. The test fails, with the end of the run's output, if the run ends
    first or `ready()` does not hold within `timeout` s (the run is killed then too: it never outlives the test)."""
    import contextlib
    import os
    import signal
    import subprocess
    import tempfile
    import time

    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryFile("w+") as output:  # a file, not a pipe: a chatty run never blocks on a full pipe
        proc = subprocess.Popen(cmd, cwd=repo, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    output.seek(0)
                    pytest.fail(f"the run {'ended' if proc.poll() is not None else f'ran {timeout:g} s'} before "
                                f"{what} (exit {proc.returncode}):\n{output.read()[-4000:]}")  # fmt: skip
                time.sleep(0.2)
        finally:
            workers = descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended (exit {proc.returncode}) before it was killed at {what}"


@pytest.fixture(scope="session")
def kill_at():
    """`kill_when`: run a command until a condition holds, then SIGKILL it and every process below it."""
    return kill_when


def checkpoint_step(out: Path) -> int:
    """The step of the newest complete checkpoint in run folder `out` (0: none yet)."""
    from agentenv.training.checkpoint import latest_checkpoint, read_state

    last = latest_checkpoint(out)
    return int(read_state(last)["step"]) if last is not None else 0


@pytest.fixture(scope="session")
def train_until_checkpoint(kill_at):
    """Trains run config `cfg` with the `agentenv train` command and SIGKILLs it once checkpoint `step` (or a
    later one) is complete; returns the step of the newest complete checkpoint the kill left."""

    def run(cfg: RunConfig, cfg_file: Path, step: int, env: dict | None = None) -> int:
        import yaml

        cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
        out = Path(cfg.trainer.output_dir)
        kill_at([sys.executable, "-m", "agentenv.cli", "train", str(cfg_file)], lambda: checkpoint_step(out) >= step,
                f"checkpoint {step}", env=env)  # fmt: skip
        return checkpoint_step(out)

    return run
