"""Bing Web Search v7 client, for any endpoint that speaks its format.

Bing's public API was retired in 2025; the paper reached it through a paid
proxy. Point `endpoint` (or AGENTENV_BING_ENDPOINT) at whatever serves
`GET {endpoint}/v7.0/search?q=&count=&mkt=` with the `Ocp-Apim-Subscription-Key`
header and answers with `webPages.value[]` (`name`, `url`, `snippet`).
"""

from __future__ import annotations

import os
from typing import Any

from agentenv.errors import ToolError
from agentenv.tools.search.format import Passage
from agentenv.tools.search.http import HTTPSearchTool, json_text

KEY_VARS = ("AGENTENV_BING_KEY", "BING_SEARCH_V7_SUBSCRIPTION_KEY")
"""Environment variables read for the key, in this order."""
ENDPOINT_VAR = "AGENTENV_BING_ENDPOINT"
MARKET_VAR = "AGENTENV_BING_MARKET"
DEFAULT_ENDPOINT = "https://api.bing.microsoft.com"
MAX_COUNT = 50
"""Bing returns at most 50 results per request."""


class BingSearchTool(HTTPSearchTool):
    """Web search through a Bing v7 endpoint. See `HTTPSearchTool` for k, cut, retries and limits.

    Args:
        api_key: Subscription key; default from AGENTENV_BING_KEY or BING_SEARCH_V7_SUBSCRIPTION_KEY.
        endpoint: Base url (`/v7.0/search` is appended unless present); default
            AGENTENV_BING_ENDPOINT, else Microsoft's.
        market: `mkt` parameter; default AGENTENV_BING_MARKET, else en-US.

    Raises:
        ToolError: No key in the arguments or the environment.
    """

    provider = "bing"

    def __init__(self, api_key: str | None = None, endpoint: str | None = None, market: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        key = api_key or next((os.environ[v] for v in KEY_VARS if os.environ.get(v)), None)
        if not key:
            raise ToolError(
                f"Bing search needs an API key: set the environment variable {KEY_VARS[0]} "
                f"(or {KEY_VARS[1]}), or `api_key` in the search config."
            )
        self._key = key
        base = (endpoint or os.environ.get(ENDPOINT_VAR) or DEFAULT_ENDPOINT).rstrip("/")
        self.url = base if base.endswith("/v7.0/search") else base + "/v7.0/search"
        self.market = market or os.environ.get(MARKET_VAR) or "en-US"

    def __repr__(self) -> str:  # never print the key
        return f"BingSearchTool(url={self.url!r}, market={self.market!r}, k={self.k})"

    @property
    def cache_params(self) -> dict[str, Any]:
        # The endpoint is left out on purpose: proxies of the same index share entries.
        return {**super().cache_params, "market": self.market}

    def _request(self, query: str) -> tuple[str, dict[str, str], dict[str, str]]:
        params = {"q": query, "count": str(min(self.k, MAX_COUNT)), "mkt": self.market}
        return self.url, params, {"Ocp-Apim-Subscription-Key": self._key}

    def _parse(self, payload: Any) -> list[Passage]:
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        pages = payload.get("webPages")
        if pages is None:  # Bing leaves webPages out when nothing matched
            return []
        out = []
        for item in pages["value"]:
            url = json_text(item, "url")
            out.append(Passage(title=json_text(item, "name"), text=json_text(item, "snippet"), url=url, id=url))
        return out

    def _auth_hint(self) -> str:
        return f"Check the key in {KEY_VARS[0]} (or {KEY_VARS[1]}) and that it belongs to {self.url}."
