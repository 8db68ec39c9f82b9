"""The Policy protocol: a language model that reports logprob and entropy per token."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from agentenv.types import Generation, SamplingParams, Tokenizer


@runtime_checkable
class Policy(Protocol):
    """A sampler over token ids.

    Concurrent `generate` calls (from the rollout engine's coroutines) are
    batched by the backend. Every sampled token comes with the sampler's
    log-probability and the entropy of the distribution it was drawn from (at
    the sampling temperature).
    """

    tokenizer: Tokenizer
    weight_version: int
    """The version of the weights it samples with: 0 as built, one more per `load_weights`.
    Every `Generation` reports it per token (`Generation.versions`)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Take the trainer's new weights (name -> tensor); `weight_version` goes up by one."""
        ...


# Optional capabilities a backend may have besides the Protocol (checked with isinstance where the policy is built):
# `agentenv.types.Closeable` (`close()`), `HasMetrics` (`metrics()`), `ResetsMetrics` (`reset_metrics()`), and:
@runtime_checkable
class JoinsWeightGroup(Protocol):
    """Receives the trainer's weights over an NCCL weight group (`agentenv.policies.weight_group`; the vLLM backend)."""

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> list[int]:
        """Join the group; returns the ranks its workers took."""
        ...

    def load_weights_from_group(self) -> None:
        """`load_weights` with the tensors the group's rank 0 broadcasts now (blocks until they arrived)."""
        ...
