"""SearXNG adapter: open-source metasearch a lab can host itself (`/search?q=&format=json`)."""

from __future__ import annotations

import os
from typing import Any

from agentenv.errors import ToolError
from agentenv.tools.search.format import Passage
from agentenv.tools.search.http import HTTPSearchTool, json_text

ENDPOINT_VAR = "AGENTENV_SEARXNG_ENDPOINT"


class SearxngSearchTool(HTTPSearchTool):
    """Web search through a SearXNG instance. See `HTTPSearchTool` for k, cut, retries and limits.

    Args:
        endpoint: Base url of the instance; default AGENTENV_SEARXNG_ENDPOINT.
        language: SearXNG `language` parameter (e.g. "en"); None: the instance's default.
        categories: SearXNG `categories` parameter (e.g. "general").

    Raises:
        ToolError: No endpoint in the arguments or the environment.
    """

    provider = "searxng"

    def __init__(self, endpoint: str | None = None, language: str | None = None, categories: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        base = endpoint or os.environ.get(ENDPOINT_VAR)
        if not base:
            raise ToolError(
                f"SearXNG search needs the instance's url: set the environment variable {ENDPOINT_VAR} "
                "or `endpoint` in the search config (e.g. http://127.0.0.1:8888)."
            )
        self.url = base.rstrip("/") + "/search"
        self.language = language
        self.categories = categories

    def __repr__(self) -> str:
        return f"SearxngSearchTool(url={self.url!r}, k={self.k})"

    @property
    def cache_params(self) -> dict[str, Any]:
        # Instances differ in their engines, so the endpoint is part of the key.
        return {**super().cache_params, "url": self.url, "language": self.language, "categories": self.categories}

    def _request(self, query: str) -> tuple[str, dict[str, str], dict[str, str]]:
        params = {"q": query, "format": "json"}
        if self.language:
            params["language"] = self.language
        if self.categories:
            params["categories"] = self.categories
        return self.url, params, {"Accept": "application/json"}

    def _parse(self, payload: Any) -> list[Passage]:
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        out = []
        for item in payload["results"]:
            url = json_text(item, "url")
            out.append(Passage(title=json_text(item, "title"), text=json_text(item, "content"), url=url, id=url))
        return out

    def _auth_hint(self) -> str:
        return "SearXNG answers 403 when JSON output is off: add `json` to `search.formats` in its settings.yml."
