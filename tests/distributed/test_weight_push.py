"""A weight push through Ray's object store (`RayPolicy.load_weights`) on a real local cluster of two nodes.

Two rollout workers, one per node, each with a policy that keeps the digest of
every tensor it was given: the trainer's weights must arrive bit for bit on
both, chunk by chunk (one worker reads the lead's node's object store where the
chunks lie, the other fetches them across nodes, ahead of its engine's load).
One cluster for the module; no engine (the engine's leg of a push is
`tests/policies/test_vllm.py` and `test_vllm_worker.py`).
"""

from __future__ import annotations

import hashlib

import pytest
import ray
import torch

pytestmark = [pytest.mark.slow]

NAMESPACE = "agentenv-test-push"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    store = {"object_store_memory": 100 << 20}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"rollout": 1}, "include_dashboard": False, **store})
    c.add_node(num_cpus=1, resources={"rollout": 1}, **store)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address=c.address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _digest(t: torch.Tensor) -> str:
    """dtype, shape and the bytes of a tensor (bit for bit)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{t.dtype} {tuple(t.shape)} {hashlib.sha256(raw).hexdigest()}"


def test_a_push_arrives_bit_exact_on_two_workers_on_two_nodes(cluster):
    from agentenv.distributed.client import RayPolicy
    from agentenv.distributed.worker import RolloutWorker, WeightStore

    class Keeps:  # a policy that keeps what it loaded, as digests (defined here: Ray ships it by value)
        tokenizer = None

        def __init__(self):
            self.weight_version = 0
            self.digests: dict[str, str] = {}

        async def generate(self, prompt_ids, params):
            raise NotImplementedError

        def load_weights(self, named_tensors):
            import hashlib

            import torch

            out = {}
            for name, t in named_tensors:
                raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                out[name] = f"{t.dtype} {tuple(t.shape)} {hashlib.sha256(raw).hexdigest()}"
            self.digests = out
            self.weight_version += 1

        def metrics(self):
            return dict(self.digests)

    store = ray.remote(WeightStore).options(name="push-store").remote()
    workers = [
        ray.remote(RolloutWorker).options(resources={"rollout": 1}, num_cpus=0, max_restarts=0).remote(i, Keeps, "push-store")
        for i in range(2)
    ]
    policy = RayPolicy(workers, store, None, chunk_bytes=64 << 10)  # 64 KiB: a push of many chunks
    try:
        g = torch.Generator().manual_seed(0)
        for push in (1, 2):
            weights = {
                "embed": torch.randn(300, 128, generator=g),  # 150 KiB: a chunk of its own
                "proj": torch.randn(64, 96, generator=g).t(),  # not contiguous
                "bf16": torch.randn(40, 33, generator=g).to(torch.bfloat16),  # travels as int16 bits
                "norm": torch.randn(128, generator=g, dtype=torch.float64),
                "ids": torch.arange(push, 500 + push),
                "scalar": torch.tensor(float(push)),
                "empty": torch.empty(0, 3),
            }
            policy.load_weights(weights.items())
            want = {name: _digest(t) for name, t in weights.items()}
            infos = policy.worker_info()
            assert len({i["node_id"] for i in infos}) == 2  # one worker fetched the chunks from the other node
            for info in infos:
                assert info["version"] == policy.weight_version == push
                assert info["metrics"] == want, info["index"]
    finally:
        policy.close()
