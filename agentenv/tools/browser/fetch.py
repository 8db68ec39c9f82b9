"""Fetching one url with aiohttp: address checks, redirects, timeouts, a size cap.

Every way a page can fail (a 404, a stall, a redirect loop, a binary file, a
refused address) raises `PageError`, whose message the model reads; none of
them is an infrastructure fault.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from agentenv.tools.browser.config import BrowserConfig
from agentenv.tools.browser.extract import classify, unsupported_message
from agentenv.tools.browser.guard import AddressPolicy, BlockedAddress, GuardedResolver
from agentenv.tools.browser.page import PageError, RawPage
from agentenv.tools.sessions import LoopSessions

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_ACCEPT = "text/html,application/xhtml+xml,text/plain;q=0.9,application/pdf;q=0.8,*/*;q=0.5"


def normalize_url(url: str) -> str:
    """Check the url is http(s) with a host; a bare `example.com/page` becomes `https://example.com/page`.

    Raises:
        PageError: Another scheme, no host, or not a url at all.
    """
    given = url = url.strip()
    implicit = "://" not in url and not url.lower().startswith(("mailto:", "javascript:", "data:", "file:"))
    if implicit:
        url = "https://" + url
    try:
        u = URL(url)
    except (ValueError, TypeError) as e:
        raise PageError("bad_url", f"not a valid url: {given!r} ({e})") from None
    if u.scheme not in ("http", "https"):
        raise PageError("bad_url", f"cannot browse {given!r}: only http and https urls can be fetched")
    if not u.raw_host or any(c.isspace() for c in url):
        raise PageError("bad_url", f"not a valid url: {given!r}")
    if implicit and "." not in u.raw_host and ":" not in u.raw_host:
        # A bare word ("Eiffel") is a search term, not a site: no DNS lookup for it.
        raise PageError("bad_url", f"{given!r} is not a url; give a full address such as https://example.com/page")
    return str(u.with_fragment(None))  # "#section" names a part of the same page (and cache entry)


class Fetcher:
    """Reads pages over one pooled aiohttp session (created lazily, per event loop).

    Args:
        config: Timeouts, caps and the address policy.
    """

    def __init__(self, config: BrowserConfig):
        self.config = config
        self.policy = AddressPolicy(config.allow_hosts, config.allow_private)
        self.sessions = LoopSessions(self._new_session)  # a sync caller may run each call in a fresh loop
        self.requests = 0
        """HTTP requests sent (redirect hops included)."""

    def _new_session(self) -> aiohttp.ClientSession:
        cfg = self.config
        connector = aiohttp.TCPConnector(limit=cfg.max_concurrency, resolver=GuardedResolver(self.policy))
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s),
            headers={"User-Agent": cfg.user_agent, "Accept": _ACCEPT, "Accept-Language": "en;q=1.0, *;q=0.5"},
            cookie_jar=aiohttp.DummyCookieJar(),  # no state shared between episodes
            trust_env=False,  # an environment proxy would bypass the address checks
        )

    async def fetch(self, url: str) -> RawPage:
        """Fetch `url`, following redirects.

        Raises:
            PageError: Anything that keeps the page from being read.
        """
        cfg = self.config
        start = normalize_url(url)
        current = start
        seen = {current}
        progress = [0]  # body bytes read so far, for the timeout message
        session = self.sessions.get()
        try:
            async with asyncio.timeout(cfg.timeout_s):
                for hop in range(cfg.max_redirects + 1):
                    await self._check_address(current)
                    self.requests += 1
                    async with session.get(current, allow_redirects=False) as resp:
                        location = resp.headers.get("Location")
                        if resp.status in _REDIRECTS and location:
                            nxt = normalize_url(urljoin(current, location))
                            if nxt in seen:
                                raise PageError("redirect_loop", f"{start} redirects in a loop (back to {nxt})")
                            seen.add(nxt)
                            current = nxt
                            continue
                        if resp.status >= 400:
                            raise PageError(
                                "http_status", f"{current} answered HTTP {resp.status} {resp.reason or ''}".rstrip()
                            )
                        ctype = resp.content_type.lower() if "Content-Type" in resp.headers else ""
                        if classify(ctype) == "binary":
                            # Refused before the body is downloaded.
                            raise PageError("unsupported_type", unsupported_message(ctype, resp.content_length, current))
                        body, truncated = await _read_capped(resp, cfg.max_bytes, progress)
                        return RawPage(
                            url=start,
                            final_url=current,
                            status=resp.status,
                            content_type=ctype,
                            charset=resp.charset,
                            body=body,
                            truncated=truncated,
                            redirects=hop,
                        )
                raise PageError("too_many_redirects", f"{start} redirected more than {cfg.max_redirects} times")
        except PageError:
            raise
        except TimeoutError as e:
            got = f" after {progress[0]} bytes" if progress[0] else ""
            if isinstance(e, aiohttp.ConnectionTimeoutError):
                what = f"did not accept a connection within {cfg.connect_timeout_s:g} s"
            elif isinstance(e, aiohttp.ServerTimeoutError):
                what = f"stopped sending for {cfg.read_timeout_s:g} s{got}"
            else:  # asyncio.timeout: the whole fetch
                what = f"did not finish loading within {cfg.timeout_s:g} s{got}"
            raise PageError("timeout", f"{current} {what}; the page did not load") from None
        except BlockedAddress as e:
            raise PageError("blocked", str(e)) from None
        except aiohttp.ClientConnectorError as e:
            blocked = _cause(e, BlockedAddress)
            if blocked is not None:
                raise PageError("blocked", str(blocked)) from None
            if isinstance(e, aiohttp.ClientConnectorDNSError):
                raise PageError("dns", f"could not resolve the host of {current}") from None
            raise PageError("connect", f"could not connect to {current} ({e.os_error.strerror or e})") from None
        except socket.gaierror:
            raise PageError("dns", f"could not resolve the host of {current}") from None
        except aiohttp.InvalidURL as e:
            raise PageError("bad_url", f"not a valid url: {e}") from None
        except aiohttp.ClientPayloadError as e:
            raise PageError("broken", f"{current} sent a broken body ({e})") from None
        except aiohttp.ClientResponseError as e:
            raise PageError("broken", f"{current} sent an invalid response ({e.message})") from None
        except aiohttp.ClientError as e:
            raise PageError("network", f"fetching {current} failed ({type(e).__name__}: {e})") from None
        except (ConnectionError, OSError) as e:
            raise PageError("network", f"fetching {current} failed ({e})") from None

    async def _check_address(self, url: str) -> None:
        u = URL(url)
        await self.policy.check(u.raw_host or "", u.port or (443 if u.scheme == "https" else 80))

    async def aclose(self) -> None:
        await self.sessions.aclose()


async def _read_capped(resp: aiohttp.ClientResponse, cap: int, progress: list[int]) -> tuple[bytes, bool]:
    """Read at most `cap` bytes; on overflow stop reading and drop the connection."""
    chunks: list[bytes] = []
    n = 0
    async for chunk in resp.content.iter_chunked(_CHUNK):
        if n + len(chunk) > cap:
            chunks.append(chunk[: cap - n])
            resp.close()  # the rest is never downloaded
            return b"".join(chunks), True
        chunks.append(chunk)
        n += len(chunk)
        progress[0] = n
    return b"".join(chunks), False


def _cause(e: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type `kind` among `e`'s causes (aiohttp wraps resolver errors)."""
    stack: list[BaseException | None] = [e]
    seen: set[int] = set()
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, kind):
            return cur
        stack += [getattr(cur, "os_error", None), cur.__cause__, cur.__context__]
    return None
