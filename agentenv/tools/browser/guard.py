"""Which addresses the browser may connect to.

A model that can make the trainer's machine fetch any url can reach the
machine's own services and the private network behind it (SSRF). So every host
is resolved first and *every* address it resolves to must be public; the same
check runs before each redirect hop and again inside the connector's resolver,
so the address that is connected to is always one that was checked (a DNS
answer that changes between check and connect cannot slip through).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BlockedAddress(OSError):
    """The host resolves to an address the config does not allow (raised before any connection)."""


def address_kind(ip: IPAddress) -> str | None:
    """Why `ip` is not public (`"loopback"`, `"private"`, ...), or None when it is public."""
    if isinstance(ip, ipaddress.IPv6Address):
        # ::ffff:10.0.0.1 and 2002:0a00:0001:: (6to4) carry an IPv4 address that is what gets reached.
        if ip.ipv4_mapped is not None:
            return address_kind(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            return address_kind(ip.sixtofour)
    for kind in ("unspecified", "loopback", "link_local", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:  # shared address space 100.64/10, documentation ranges, ...
        return "non-public"
    return None


@dataclass(frozen=True)
class AddressPolicy:
    """Allows public addresses, plus the hosts and networks listed in `allow_hosts`.

    Attributes:
        allow_hosts: Lowercase hostnames, addresses or networks allowed although not public.
        allow_private: Allow every address.
    """

    allow_hosts: tuple[str, ...] = ()
    allow_private: bool = False

    if TYPE_CHECKING:  # set per instance in __post_init__, not fields (a frozen dataclass's derived state)
        _networks: ClassVar[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]]
        _names: ClassVar[frozenset[str]]

    def __post_init__(self) -> None:
        networks = []
        names = set()
        for h in self.allow_hosts:
            try:
                networks.append(ipaddress.ip_network(h.strip("[]"), strict=False))
            except ValueError:
                names.add(h.rstrip("."))
        object.__setattr__(self, "_networks", tuple(networks))
        object.__setattr__(self, "_names", frozenset(names))

    def host_allowed(self, host: str) -> bool:
        """True when `host` (a name) is listed as such: all its addresses are then allowed."""
        return self.allow_private or host.lower().rstrip(".") in self._names

    def refusal(self, host: str, ip: IPAddress) -> str | None:
        """Why connecting to `ip` (an address of `host`) is refused, or None when allowed."""
        if self.host_allowed(host):
            return None
        kind = address_kind(ip)
        if kind is None:
            return None
        if any(ip.version == n.version and ip in n for n in self._networks):
            return None
        shown = host if host == str(ip) else f"{host} (resolves to {ip})"
        return (
            f"refused to fetch {shown}: {kind} address. Only public web addresses can be browsed"
            " (an operator can allow it with BrowserConfig.allow_hosts)"
        )

    async def check(self, host: str, port: int) -> list[IPAddress]:
        """Resolve `host` and check every address it resolves to.

        Raises:
            BlockedAddress: Some address is not allowed.
            socket.gaierror: The name does not resolve.
        """
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        ips = [_ip(str(info[4][0])) for info in infos]  # an IP family: the address is text
        if not ips:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        for ip in ips:
            reason = self.refusal(host, ip)
            if reason is not None:
                raise BlockedAddress(reason)
        return ips


class GuardedResolver(AbstractResolver):
    """aiohttp resolver that refuses names resolving to an address the policy forbids.

    aiohttp connects only to the addresses its resolver returns, so this is the
    last word on what is reached, whatever was checked before.
    """

    def __init__(self, policy: AddressPolicy):
        self.policy = policy
        self._inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for r in results:
            reason = self.policy.refusal(host, _ip(r["host"]))
            if reason is not None:
                raise BlockedAddress(reason)
        return results

    async def close(self) -> None:
        await self._inner.close()


def _ip(text: str) -> IPAddress:
    # getaddrinfo may append a zone to link-local IPv6 addresses ("fe80::1%eth0").
    return ipaddress.ip_address(text.split("%", 1)[0])
