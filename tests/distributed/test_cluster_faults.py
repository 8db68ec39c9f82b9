"""A bad cluster fails fast and says why; a lost weight store is rebuilt; nothing of a run outlives it.

One Ray cluster of two nodes (each with one `rollout` resource) for the module,
and simulated engines (no model): each test is about what Ray waits for.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

from agentenv.distributed.cluster import check_feasible, connect, start_policy
from agentenv.errors import ConfigError, InfraError
from agentenv.rollout.config import RayRolloutConfig
from agentenv.types import Generation, SamplingParams

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


class Sim:
    """A policy with no model: one token per call, stamped with its weight version; `load_weights` counts."""

    tokenizer = None

    def __init__(self, start_s: float = 0.0, fail: str | None = None):
        if fail:
            raise ValueError(fail)
        time.sleep(start_s)  # an engine's start
        self.weight_version = 0
        self.loaded: dict = {}

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(0.01)
        return Generation([5], [-0.1], [1.0], "length", versions=[self.weight_version])

    def load_weights(self, named_tensors):
        self.loaded = dict(named_tensors)
        self.weight_version += 1


def sim(start_s: float = 0.0, fail: str | None = None) -> Sim:
    return Sim(start_s, fail)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers get Sim by value
    # Ray's memory monitor kills actors when the machine is nearly full; these are small, and what fills a
    # shared test machine is other jobs (it killed a worker here mid-test).
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"rollout": 1}, "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"rollout": 1})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def joined(cluster):
    connect(RayRolloutConfig(address=cluster.address, namespace="faults"))
    return cluster


def _cfg(cluster, **kw) -> RayRolloutConfig:
    base = dict(address=cluster.address, namespace="faults", workers=2, worker_cpus=0, worker_resources={"rollout": 1})
    return RayRolloutConfig(**{**base, **kw})


def _run_actors() -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "faults")


# ---------------------------------------------------------------- refused before any wait
def test_an_address_where_nothing_answers_is_refused_in_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cmd = [sys.executable, "-m", "agentenv", "train", str(HERE.parents[1] / "configs" / "toy_grpo.yaml"),
           "policy.backend=hf", "rollout.placement=ray", f"rollout.ray.address=127.0.0.1:{port}",
           f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "AGENTENV_RAY_LOGS": "0"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[train] engine output")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: rollout.ray.address: nothing answers at 127.0.0.1:{port}"), errors
    assert time.monotonic() - t0 < 120  # the imports; before, it waited without end


def test_what_no_node_can_hold_is_refused_naming_the_key(joined):
    with pytest.raises(ConfigError, match=r"1000 rollout workers asked, each \{rollout: 1\} on one node; the "
                                          r"cluster's 2 nodes \(.*rollout: 2.*\) hold 2") as e:  # fmt: skip
        check_feasible(_cfg(joined, workers=1000))
    assert e.value.key == "rollout.ray.workers"
    with pytest.raises(ConfigError, match="no node of the cluster has 3 GPU .*the most on one node: 0") as e:
        start_policy(_cfg(joined, tensor_parallel_size=3), sim, None)
    assert e.value.key == "rollout.ray.tensor_parallel_size"
    with pytest.raises(ConfigError, match=r"no node of the cluster has 2 rollout") as e:
        start_policy(_cfg(joined, worker_resources={"rollout": 2}), sim, None)
    assert e.value.key == "rollout.ray.worker_resources.rollout"
    with pytest.raises(ConfigError, match=r"asks \{docker: 1\}, and no node of the cluster has it") as e:
        check_feasible(_cfg(joined, tools={"python": {"docker": 1}}))
    assert e.value.key == "rollout.ray.tools.python"
    assert _run_actors() == []  # nothing was started


# ---------------------------------------------------------------- bounded waits
def test_a_worker_that_gets_no_resources_or_never_starts_fails_in_time_and_leaves_nothing(joined):
    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"rollout": 1}], name="someone-else")  # another run holds one node's `rollout`
    assert held.wait(30)
    try:
        t0 = time.monotonic()
        with pytest.raises(InfraError, match=r"rollout worker 1 got no resources within rollout.ray.timeout_s=2 s: it "
                                             r"asks \{rollout: 1\} on one node, the cluster has \{rollout: 0\} free"):  # fmt: skip
            start_policy(_cfg(joined, timeout_s=2), sim, None)
        assert time.monotonic() - t0 < 30
    finally:
        remove_placement_group(held)
    assert _run_actors() == []  # worker 0, which had started, is gone with its reservation
    t0 = time.monotonic()
    with pytest.raises(InfraError, match=r"'rollout-worker-0' did not start within rollout.ray.timeout_s=10 s"):
        start_policy(_cfg(joined, timeout_s=10), lambda: sim(start_s=3600), None)  # before: 30 minutes
    assert time.monotonic() - t0 < 60
    with pytest.raises(InfraError, match=r"'rollout-worker-0' failed to start: .*ValueError: no engine here"):
        start_policy(_cfg(joined), lambda: sim(fail="no engine here"), None)  # before: retried for 30 minutes
    _gone(_run_actors, [])
    _gone(lambda: _workers(joined), [])  # no worker left blocked in its constructor


def _workers(cluster, *nodes) -> list[int]:
    """This cluster's rollout worker processes (the machine may run other clusters): children of its raylets."""
    from agentenv._reaper import _start_time

    raylets = {n.all_processes["raylet"][0].process.pid for n in nodes or cluster.list_all_nodes()}
    out = subprocess.run(["pgrep", "-f", "ray::.*RolloutWorker"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if _parent(int(p)) in raylets and _start_time(int(p)) is not None]


def _gone(what, empty, within_s: float = 30.0) -> None:
    end = time.monotonic() + within_s
    while (now := what()) != empty:
        assert time.monotonic() < end, now
        time.sleep(0.5)


# ---------------------------------------------------------------- a lost store
def test_a_killed_weight_store_is_made_again_and_the_run_goes_on(joined, capfd, tmp_path):
    from agentenv.training.engine_log import EngineLog

    engine_log = EngineLog(tmp_path / "engine.log")  # as the trainer's: the engine's start inside, its loggers after
    with engine_log.capture():
        policy = start_policy(_cfg(joined), sim, None)
    try:
        policy.load_weights([("w", torch.ones(2))])
        assert policy.weight_version == 1
        ray.kill(policy.store)  # the attack: the store's actor killed mid-run
        policy.load_weights([("w", torch.full((2,), 2.0))])
        assert policy.weight_version == 2 and policy.store_rebuilds == 1
        assert {i["version"] for i in policy.worker_info()} == {2}
        gen = asyncio.run(policy.generate([1, 2], SamplingParams(max_tokens=1)))
        assert gen.versions == [2]  # the run's version, not the engine's own count
        # a worker Ray restarts now finds the rebuilt store and comes back with the current weights
        victim = policy.worker_info()[0]
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(InfraError, match="died"):
            for _ in range(50):
                asyncio.run(policy.generate([1, 2], SamplingParams(max_tokens=1)))
        policy.wait_until_all_up(60)
        back = next(i for i in policy.worker_info() if i["index"] == victim["index"])
        assert back["pid"] != victim["pid"] and back["version"] == 2
        time.sleep(2)  # Ray's notice of the death reaches the driver a moment later
    finally:
        policy.close()
        engine_log.close()
    out, err = capfd.readouterr()
    assert "A worker died" not in out + err and "(raylet)" not in out + err  # Ray's notices: not on the terminal,
    assert "(raylet) A worker died" in (tmp_path / "engine.log").read_text()  # in the engine log
    _gone(_run_actors, [])


# ---------------------------------------------------------------- nothing outlives the run
def test_a_worker_blocked_in_its_constructor_does_not_outlive_its_node(joined, tmp_path):
    from agentenv._reaper import _start_time
    from agentenv.distributed.worker import RolloutWorker

    node = joined.add_node(num_cpus=0, resources={"doomed": 1})
    started = tmp_path / "started"

    def slow_engine():
        started.touch()
        return sim(start_s=3600)  # an engine that takes its time to start

    worker = ray.remote(RolloutWorker).options(num_cpus=0, resources={"doomed": 1}, max_restarts=0).remote(
        0, slow_engine, "no-store"
    )  # fmt: skip
    end = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < end, "the worker never started"
        time.sleep(0.5)
    pids = _workers(joined, node)
    assert len(pids) == 1
    os.kill(node.all_processes["raylet"][0].process.pid, signal.SIGKILL)  # the raylet dies under the starting worker
    alive = lambda: [p for p in pids if _start_time(p) is not None]  # noqa: E731 - a zombie is dead
    try:
        _gone(alive, [], within_s=30)  # before: still there after 60 s
    finally:
        joined.remove_node(node, allow_graceful=False)
        for p in alive():  # what a failed run of this test left: ended here
            os.kill(p, signal.SIGKILL)
    del worker


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


# ---------------------------------------------------------------- two trainer processes under async
def test_two_trainer_processes_under_async_are_refused_in_one_line_before_any_work(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "agentenv", "train", str(HERE.parents[1] / "configs" / "toy_grpo.yaml"),
           "policy.backend=hf", "trainer.max_staleness=1", f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith(("error:", "[train]", "[agentenv]"))]
    assert ours == [
        "error: trainer.max_staleness: 1 needs one trainer process (this run has 2): the asynchronous producer draws "
        "the task stream alone; scale rollout with the policy's engines (Ray placement) instead"
    ], proc.stderr  # one line (rank 0's); the rest is torchrun's own report of a failed child
    assert "agentenv/" not in proc.stderr  # no traceback of ours
    assert not (tmp_path / "run").exists()  # refused before any process started work
