"""`rollout.endpoint`: where the OpenAI-compatible endpoint listens and whom it serves (no aiohttp import here)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agentenv.errors import ConfigError
from agentenv.loader import check_number


@dataclass(frozen=True)
class EndpointConfig:
    """The OpenAI-compatible endpoint a user's agent (`rollout.agent`) talks to.

    Attributes:
        host: Address the server binds. The default, 127.0.0.1, is reachable
            from this machine only.
        port: TCP port; 0 picks a free one (each process of a run gets its own).
        allow_remote: Serve clients that are not on a loopback address. Off, a
            request from any other address is refused (403) even when `host`
            binds every interface (`0.0.0.0`), e.g. for an agent in a container.
        model_name: The model name `/v1/models` lists and requests must give
            (`model=`); another name is answered 404 `model_not_found`.
        max_request_bytes: Largest request body accepted (413 beyond).
        max_requests_per_episode: Most chat completions one episode may ask for;
            past it a request is refused (429 `episode_request_limit`, counted in
            `rollout/endpoint_errors`) and the agent's episode goes on without it.
        max_concurrent_per_episode: Most of one episode's requests rendered or
            generated at once; more wait their turn (first come, first served),
            so one episode's burst holds at most this many of the policy's
            slots and never starves the other episodes' requests.
    """

    host: str = "127.0.0.1"
    port: int = 0
    allow_remote: bool = False
    model_name: str = "agentenv"
    max_request_bytes: int = 8 * 1024 * 1024
    max_requests_per_episode: int = 64
    max_concurrent_per_episode: int = 4

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ConfigError(
                "rollout.endpoint.host", f"must be an IP address (127.0.0.1, 0.0.0.0, ::1), got {self.host!r}"
            ) from None
        check_number("rollout.endpoint.port", self.port, low_ok=True, integer=True)
        if self.port > 65535:
            raise ConfigError("rollout.endpoint.port", f"must be in 0..65535, got {self.port}")
        if not isinstance(self.model_name, str) or not self.model_name.strip():
            raise ConfigError("rollout.endpoint.model_name", f"must name the served model, got {self.model_name!r}")
        check_number("rollout.endpoint.max_request_bytes", self.max_request_bytes, low=1024, low_ok=True, integer=True)
        check_number("rollout.endpoint.max_requests_per_episode", self.max_requests_per_episode, low=1, low_ok=True,
                     integer=True)  # fmt: skip
        check_number("rollout.endpoint.max_concurrent_per_episode", self.max_concurrent_per_episode, low=1, low_ok=True,
                     integer=True)  # fmt: skip
