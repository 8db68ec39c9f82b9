"""Policy backends by name (`policy.backend`): each a factory and the config class of its settings.

    from agentenv.policies.backends import register_policy_backend
    register_policy_backend("sglang", "my_pkg.sglang:make_policy", "my_pkg.sglang:SGLangConfig")

`factory(config) -> Policy`. The config class must have a `model` field (the
run fills in the model folder) and may have `dtype` and `seed` (filled from
`model.dtype` and `trainer.seed`). A package can ship a backend in the
`agentenv.policies` entry-point group; a config can name one as `module:attr`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, cast, runtime_checkable

from agentenv.policies.base import Policy
from agentenv.registry import Part, Registry, as_part

POLICY_BACKENDS: Registry[Part[Policy]] = Registry("policy backend", "policy.backend", group="agentenv.policies", adapt=as_part)


@runtime_checkable
class BoundsContext(Protocol):
    """A backend's settings that cap the model's context (hf, vLLM): `max_model_len`, None for the model's own."""

    max_model_len: int | None


def register_policy_backend(name: str, factory: Any, config_cls: Any, *, overwrite: bool = False) -> None:
    """Register a backend: `factory(config) -> Policy`, settings validated by `config_cls`."""
    POLICY_BACKENDS.register(name, Part(factory, config_cls), overwrite=overwrite)


def build_policy(name: str, config: Any, model_path: str) -> Policy:
    """The rollout policy of backend `name` from its validated settings, serving `model_path`."""
    part = POLICY_BACKENDS.get(name)
    if dataclasses.is_dataclass(config):
        config = dataclasses.replace(cast(Any, config), model=model_path)  # an instance: the validated settings
    else:
        config = {**config, "model": model_path}
    return part.make(config)


# The built-in backends, registered as a user's are. Only strings: vLLM and torch load when a run asks.
register_policy_backend("hf", "agentenv.policies.hf:HFPolicy", "agentenv.policies.config:HFPolicyConfig")
register_policy_backend("vllm", "agentenv.policies.vllm:make_vllm_policy", "agentenv.policies.vllm:VLLMPolicyConfig")
