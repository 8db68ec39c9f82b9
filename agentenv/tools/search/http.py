"""What every web search provider shares: retries, backoff, rate and concurrency limits.

A provider subclass says how to build the request and how to read the answer;
this base turns transport faults into retries and, when retries run out, into a
`ToolError` (or an error result, with `on_error="result"`). Nothing here raises
anything else, so a flaky provider never crashes a rollout.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import email.utils
import json
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentenv.errors import ToolError
from agentenv.tools.search.format import (
    DEFAULT_K,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_RESPONSE_BYTES,
    SEARCH_DESCRIPTION,
    SEARCH_SCHEMA,
    Passage,
    format_pages,
    no_results_text,
    refuse_query,
)
from agentenv.tools.search.ratelimit import TokenBucket
from agentenv.tools.sessions import LoopSessions
from agentenv.types import ToolResult

if TYPE_CHECKING:  # pragma: no cover
    import aiohttp

OnError = Literal["raise", "result"]


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to retry a request.

    Attributes:
        timeout_s: Limit for one request, connect to last byte.
        max_retries: Retries after the first try (429, 5xx, timeouts, malformed answers).
        backoff_s: First backoff; doubles each retry, with jitter in [d/2, d].
        max_backoff_s: Cap of one backoff.
        max_retry_after_s: A `Retry-After` longer than this fails at once instead of stalling the rollout.
    """

    timeout_s: float = 20.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def backoff(self, attempt: int) -> float:
        d = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        return float(d / 2 + random.uniform(0, d / 2))


class _Rejected(Exception):
    """The provider refused this query (HTTP 400/422): the agent's fault, so a result."""


class _Fatal(ToolError):
    """Credentials or endpoint are wrong: raised even with `on_error="result"` (no search can succeed)."""


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class HTTPSearchTool(abc.ABC):
    """Base of the web providers. Subclasses set `provider` and implement `_request` and `_parse`.

    One aiohttp session and one concurrency limit per event loop, shared by
    every fork. `fork()` returns a handle on the same pool whose `aclose` does
    nothing; the prototype's `aclose` closes the pool.

    Args:
        k: Results per query.
        max_chars: Each snippet is cut to this many characters.
        show_url: Print each page's url under its title.
        retry: Timeouts and retry schedule.
        concurrency: Requests in flight at once (per event loop).
        limiter: Token bucket every request (retries included) takes a token from.
        on_error: `raise` a ToolError when retries run out (the rollout marks the
            episode failed), or return an error `result` the model reads.
        max_response_bytes: A longer body is not read: the search fails with a
            ToolError (an error result with `on_error="result"`).
    """

    name = "search"
    description = SEARCH_DESCRIPTION
    schema = SEARCH_SCHEMA
    provider = "http"

    def __init__(
        self,
        k: int = DEFAULT_K,
        max_chars: int = DEFAULT_MAX_CHARS,
        show_url: bool = False,
        retry: RetryPolicy = RetryPolicy(),
        concurrency: int = 16,
        limiter: TokenBucket | None = None,
        on_error: OnError = "raise",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ):
        self.k = k
        self.max_response_bytes = max_response_bytes
        self.max_chars = max_chars
        self.show_url = show_url
        self.retry = retry
        self.concurrency = concurrency
        self.limiter = limiter
        self.on_error = on_error
        self.sessions = LoopSessions(self._new_session, concurrency)
        self._owner = True
        self._stats = {"requests": 0, "retries": 0, "failures": 0}  # shared by every fork

    # -- provider hooks ------------------------------------------------------
    @abc.abstractmethod
    def _request(self, query: str) -> tuple[str, dict[str, str], dict[str, str]]:
        """(url, query params, headers) for one search."""

    @abc.abstractmethod
    def _parse(self, payload: Any) -> list[Passage]:
        """Hits from the decoded JSON; raise ValueError when it is not the provider's format."""

    @property
    def cache_params(self) -> dict[str, Any]:
        return {"k": self.k, "max_chars": self.max_chars, "show_url": self.show_url}

    # -- the Tool protocol ---------------------------------------------------
    async def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        q, refused = refuse_query(query)
        if refused is not None:
            return refused
        try:
            hits = (await self._search(q))[: self.k]
        except _Rejected as e:
            return ToolResult(text="", ok=False, error=str(e), latency_s=time.perf_counter() - t0, kind="refused")
        except ToolError as e:
            if self.on_error == "raise" or isinstance(e, _Fatal):
                raise
            return ToolResult(
                text="",
                ok=False,
                error="Search is unavailable right now; try again later or answer without it.",
                latency_s=time.perf_counter() - t0,
                metadata={"provider": self.provider, "infra_error": str(e)},
                kind="http",
            )
        text = format_pages(hits, self.max_chars, self.show_url) if hits else no_results_text(q)
        return ToolResult(
            text=text,
            latency_s=time.perf_counter() - t0,
            metadata={"provider": self.provider, "num_results": len(hits), "urls": [h.url for h in hits]},
        )

    def metrics(self) -> dict[str, float]:
        """Requests sent (retries included), retries, searches that failed, seconds spent waiting for the rate limit."""
        out = {f"search/{k}": float(v) for k, v in self._stats.items()}
        out["search/rate_wait_s"] = self.limiter.waited_s if self.limiter is not None else 0.0
        return out

    def fork(self) -> HTTPSearchTool:
        handle = copy.copy(self)  # shares the sessions and the limiter
        handle._owner = False
        return handle

    async def aclose(self) -> None:
        if self._owner:
            await self.sessions.aclose()

    # -- transport -----------------------------------------------------------
    def _new_session(self) -> aiohttp.ClientSession:
        import aiohttp

        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.retry.timeout_s))

    async def _search(self, query: str) -> list[Passage]:
        """One search with retries. Raises `_Rejected` (agent's fault) or `ToolError`."""
        reasons = []
        for attempt in range(self.retry.max_retries + 1):
            try:
                return await self._attempt(query)
            except _Retryable as e:
                reasons.append(str(e))
                if attempt == self.retry.max_retries:
                    break
                self._stats["retries"] += 1
                delay = self.retry.backoff(attempt)
                if e.retry_after is not None:
                    if e.retry_after > self.retry.max_retry_after_s:
                        self._stats["failures"] += 1
                        raise ToolError(
                            f"{self.provider} asks to wait {e.retry_after:.0f} s (Retry-After), more than "
                            f"max_retry_after_s={self.retry.max_retry_after_s:g}; lower the request rate or raise the limit."
                        ) from None
                    delay = max(delay, e.retry_after)
                await asyncio.sleep(delay)
        self._stats["failures"] += 1
        raise ToolError(
            f"{self.provider} search failed after {len(reasons)} attempts ({'; '.join(reasons)}). "
            f"Check that the endpoint is up and reachable, or raise timeout_s/max_retries."
        )

    async def _attempt(self, query: str) -> list[Passage]:
        import aiohttp

        url, params, headers = self._request(query)
        if self.limiter is not None:
            await self.limiter.acquire()
        async with self.sessions.slot():
            self._stats["requests"] += 1
            try:
                async with self.sessions.get().get(url, params=params, headers=headers) as resp:
                    status = resp.status
                    retry_after = _parse_retry_after(resp.headers.get("Retry-After"))
                    body = await self._read_capped(resp)
            except TimeoutError:
                raise _Retryable(f"timed out after {self.retry.timeout_s:g} s") from None
            except aiohttp.ClientError as e:
                raise _Retryable(f"{type(e).__name__}: {e}") from None
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}", retry_after)
        if status != 200:
            self._raise_for_status(status, body)
        try:
            return self._parse(json.loads(body))
        except Exception as e:  # noqa: BLE001 - any shape (RecursionError on deep nesting too) is a bad answer
            raise _Retryable(f"malformed response ({type(e).__name__}: {str(e)[:120]})") from None

    async def _read_capped(self, resp: Any) -> bytes:
        """The body, or a ToolError as soon as it is known to exceed `max_response_bytes`."""
        cap = self.max_response_bytes
        if resp.content_length is not None and resp.content_length > cap:
            self._too_large(f"{resp.content_length} bytes announced")
        chunks, size = [], 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > cap:
                self._too_large(f"more than {cap} bytes sent")
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, what: str) -> None:
        self._stats["failures"] += 1
        raise ToolError(
            f"{self.provider} answered with an oversized body ({what}; limit max_response_bytes="
            f"{self.max_response_bytes}). Check the endpoint url, or raise search.max_response_bytes."
        )

    def _raise_for_status(self, status: int, body: bytes) -> None:
        detail = body[:200].decode("utf-8", "replace").strip()
        if status in (400, 422):
            raise _Rejected(f"The search provider rejected this query (HTTP {status}). Rephrase it.")
        if status in (401, 403):
            raise _Fatal(f"{self.provider} refused the credentials (HTTP {status}): {detail!r}. {self._auth_hint()}")
        raise _Fatal(f"{self.provider} answered HTTP {status}: {detail!r}. Check the endpoint url.")

    def _auth_hint(self) -> str:
        return "Check the API key."


def json_text(item: Any, key: str) -> str:
    """A text field of a provider's JSON hit: `null` or missing is "", never "None".

    Raises:
        AttributeError: `item` is not an object (a malformed answer).
    """
    value = item.get(key)
    return "" if value is None else str(value)


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
