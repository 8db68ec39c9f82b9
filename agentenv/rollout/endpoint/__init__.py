"""An OpenAI-compatible endpoint over the training policy, and a user's agent as the rollout.

`config` (EndpointConfig) and `recorder` (the token-exact stitching) import no
server; `server` (aiohttp) and `agent` (the openai client) are imported when a
run sets `rollout.agent`.
"""

from agentenv.rollout.endpoint.config import EndpointConfig

__all__ = ["EndpointConfig"]
