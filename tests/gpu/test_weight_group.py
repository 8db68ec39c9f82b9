"""The weight-broadcast group (`agentenv.policies.weight_group`): a trainer's tensors reach a receiver's module.

Two processes: rank 0 sends a model's weights (`send`, one tensor at a time),
rank 1 receives them (`receive`) and loads them into a fresh module of the same
shape. The gloo case runs everywhere (the same code as NCCL's, on CPU); the
NCCL case needs two GPUs (NCCL refuses two ranks on one device); the one-GPU
case sends CUDA tensors over gloo into a module on the GPU.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 50))


def _run(rank: int, port: int, backend: str, devices: list[str], out: dict) -> None:
    from agentenv.policies.weight_group import WeightGroup

    device = devices[rank]
    group = WeightGroup("127.0.0.1", port, rank, 2, backend=backend, device=device, timeout_s=120)  # type: ignore[arg-type]
    try:
        for push in range(2):  # two pushes through one group: the store's keys of one never mix with the other's
            if rank == 0:
                sent = _model(push).to(device)
                group.send(sent.state_dict().items())
            else:
                received = _model(99).to(device)
                received.load_state_dict(dict(group.receive()))
                ref = _model(push)
                out[push] = all(
                    torch.equal(a.cpu(), b) for a, b in zip(received.state_dict().values(), ref.state_dict().values(), strict=True)
                )
                out[f"device{push}"] = str(next(received.parameters()).device)
    finally:
        group.close()


def _broadcast(backend: str, devices: list[str]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Manager().dict()
    procs = [ctx.Process(target=_run, args=(r, port, backend, devices, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return dict(out)


def test_gloo_broadcast_loads_the_senders_weights():
    out = _broadcast("gloo", ["cpu", "cpu"])
    assert out[0] and out[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_over_the_group_into_a_gpu_module():
    out = _broadcast("gloo", ["cuda:0", "cuda:0"])
    assert out[0] and out[1] and out["device1"] == "cuda:0"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: two GPUs")
def test_nccl_broadcast_between_two_gpus():
    out = _broadcast("nccl", ["cuda:0", "cuda:1"])
    assert out[0] and out[1] and out["device1"] == "cuda:1"
