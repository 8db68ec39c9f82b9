"""Weights broadcast from the trainer to the engines over a process group of their own (NCCL on GPUs).

The GPU path of a weight push (`rollout.ray.weight_transport: nccl`): rank 0 is
the trainer's lead process, ranks 1.. the engines' GPU workers (every
tensor-parallel rank of every rollout worker). The group is not the trainer's
default one (torchrun's), so training collectives and weight pushes never mix:
it rendezvouses over a `TCPStore` of its own and is built as a bare
`ProcessGroupNCCL` (`ProcessGroupGloo` for CPU tensors: the same code, tested
on CPU). Each tensor's name, dtype and shape go through the store just before
the tensor itself is broadcast, so the sender streams one tensor at a time
(gathered shards, merged LoRA) and receivers need no list in advance.

Receivers in vLLM hold the tensors until the last one and load them in one
in-place reload (`WorkerExtension.agentenv_nccl_receive`), the path vLLM
documents for RLHF weight updates (a worker extension reached by
`collective_rpc`, then the model's `load_weights`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any, Literal

Backend = Literal["nccl", "gloo"]


class WeightGroup:
    """One member of the weight-broadcast group.

    Args:
        host: Address of the rank-0 process's `TCPStore` (the trainer's lead).
        port: Its port.
        rank: 0 for the sender, 1.. for receivers.
        world_size: 1 + every receiving GPU worker.
        backend: `nccl` (GPU tensors) or `gloo` (CPU tensors).
        device: Where received tensors are made (and sent ones moved to).
        timeout_s: Bound on the rendezvous and on each collective.
    """

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, *, backend: Backend = "nccl",
        device: Any = None, timeout_s: float = 600.0,
    ):  # fmt: skip
        import torch
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device if device is not None else ("cuda" if backend == "nccl" else "cpu"))
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        prefix = dist.PrefixStore("agentenv-weights", self.store)
        if backend == "nccl":
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg: Any = dist.ProcessGroupNCCL(prefix, rank, world_size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
        self._seq = 0  # pushes so far: the store keys of one push never collide with the last one's
        self._last = (0, 0)  # (push, keys) of the last push, deleted by the next

    def _broadcast(self, tensor: Any) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def send(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Rank 0: broadcast every tensor (name, dtype, shape through the store first); returns their count."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends")
        self._seq += 1
        n = 0
        for name, tensor in named_tensors:
            t = tensor.detach().to(self.device).contiguous()
            self.store.set(f"{self._seq}/{n}", json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)]))
            self._broadcast(t)
            n += 1
        self.store.set(f"{self._seq}/{n}", "null")
        seq, count = self._last
        for i in range(count):  # the last push's keys: every receiver has read them (it took part in this one)
            self.store.delete_key(f"{seq}/{i}")
        self._last = (self._seq, n + 1)
        return n

    def receive(self) -> Iterator[tuple[str, Any]]:
        """Ranks 1..: the next push's tensors, one at a time, as they arrive."""
        import torch

        self._seq += 1
        i = 0
        while True:
            meta = json.loads(self.store.get(f"{self._seq}/{i}"))
            if meta is None:
                return
            name, dtype, shape = meta
            t = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self._broadcast(t)
            yield name, t
            i += 1

    def close(self) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            self.pg.shutdown()
