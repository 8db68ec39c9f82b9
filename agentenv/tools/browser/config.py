"""`BrowserConfig`: every knob of the browser tool, validated once."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from agentenv.errors import ConfigError

DEFAULT_PASSAGE_CHARS = 6000
"""Characters of a page kept for the summarizer (ARPO's browser pipeline keeps about 6,000)."""


@dataclass(frozen=True)
class BrowserConfig:
    """Fetch, select and summarize settings.

    Attributes:
        timeout_s: Wall-clock limit of one fetch, all redirects and the body included.
        connect_timeout_s: Limit on opening one connection.
        read_timeout_s: Limit on each read from the socket (a server that stalls
            mid-body fails after this long, even while `timeout_s` has time left).
        max_redirects: Redirects followed before giving up (a loop fails sooner,
            at the first repeated url).
        max_bytes: Body bytes read (after content decoding); reading stops at the
            cap and the page is marked truncated.
        full_extraction_max_bytes: HTML up to this size goes through trafilatura's
            main-content extraction; bigger HTML (rare, and slow to extract: about
            3 s per MB) through its fast plain-text baseline.
        allow_hosts: Hostnames, addresses or networks (`"127.0.0.1"`,
            `"10.0.0.0/8"`, `"intranet.local"`) that may be fetched although they
            are loopback, private, link-local or otherwise not public. Tests allow
            `"127.0.0.1"`.
        allow_private: Allow every non-public address (only for a trusted network).
        user_agent: The User-Agent header sent.
        max_concurrency: Connections open at once (per tool and its forks).
        passage_chars: Characters of the page kept around the passage most
            relevant to the goal (ARPO: about 6,000).
        select_max_chars: Characters of a page's text (from its start) searched
            for that passage; the rest of a longer page is not read. Selection
            costs about 0.8 s and 14 MiB per million characters (a 4 MiB page:
            4-6 s and 60-120 MiB), so this bounds a hostile page's cost.
        summary_max_tokens: Most tokens the summarizer writes.
        summary_input_tokens: Most tokens of the selected passage put into the
            summarizer's prompt (the passage is cut to fit).
        summary_temperature: Summarizer sampling temperature (0 = greedy).
        cache: SQLite file that keeps extracted pages (keyed by url), shared by
            every process, the same store as search's (`search.cache`; the two
            may point at one file); None turns the cache off.
        cache_ttl_s: Cached pages older than this are fetched again; None = never expire.
    """

    timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 15.0
    max_redirects: int = 5
    max_bytes: int = 4 * 1024 * 1024
    full_extraction_max_bytes: int = 1024 * 1024
    allow_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    user_agent: str = "Mozilla/5.0 (compatible; agentenv-browser/0.1)"
    max_concurrency: int = 16
    passage_chars: int = DEFAULT_PASSAGE_CHARS
    select_max_chars: int = 500_000
    summary_max_tokens: int = 512
    summary_input_tokens: int = 3072
    summary_temperature: float = 0.0
    cache: str | None = None
    cache_ttl_s: float | None = None

    def __post_init__(self) -> None:
        for key in ("timeout_s", "connect_timeout_s", "read_timeout_s"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"browse.{key}", f"must be a finite number of seconds > 0, got {v!r}")
        if self.connect_timeout_s > self.timeout_s or self.read_timeout_s > self.timeout_s:
            raise ConfigError(
                "browse.timeout_s",
                f"total {self.timeout_s} s must be at least connect_timeout_s {self.connect_timeout_s} s "
                f"and read_timeout_s {self.read_timeout_s} s",
            )
        _check_int("max_redirects", self.max_redirects, 0)
        _check_int("max_bytes", self.max_bytes, 1024)
        _check_int("full_extraction_max_bytes", self.full_extraction_max_bytes, 0)
        _check_int("max_concurrency", self.max_concurrency, 1)
        _check_int("passage_chars", self.passage_chars, 200)
        _check_int("select_max_chars", self.select_max_chars, self.passage_chars)
        _check_int("summary_max_tokens", self.summary_max_tokens, 1)
        _check_int("summary_input_tokens", self.summary_input_tokens, 16)
        if not math.isfinite(self.summary_temperature) or self.summary_temperature < 0:
            raise ConfigError("browse.summary_temperature", f"must be >= 0, got {self.summary_temperature!r}")
        if self.cache is not None and (not isinstance(self.cache, str) or not self.cache.strip()):
            raise ConfigError("browse.cache", f"must be the path of a SQLite file or null, got {self.cache!r}")
        if self.cache_ttl_s is not None and not self.cache_ttl_s > 0:
            raise ConfigError("browse.cache_ttl_s", f"must be > 0 or None, got {self.cache_ttl_s!r}")
        if isinstance(self.allow_hosts, str):
            raise ConfigError("browse.allow_hosts", f"must be a list of hosts, got the string {self.allow_hosts!r}")
        hosts = tuple(str(h).strip().lower() for h in self.allow_hosts)
        for h in hosts:
            if not h or "/" in h and _network(h) is None:
                raise ConfigError("browse.allow_hosts", f"{h!r} is neither a hostname, an address nor a network")
        object.__setattr__(self, "allow_hosts", hosts)


def _check_int(key: str, v: Any, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"browse.{key}", f"must be an int >= {lo}, got {v!r}")


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
