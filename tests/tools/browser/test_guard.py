"""Only public addresses are fetched by default, and refusals happen before any connection."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from agentenv.tools.browser import AddressPolicy, BrowserConfig, BrowserTool, address_kind
from agentenv.tools.browser.guard import BlockedAddress, GuardedResolver


@pytest.mark.parametrize(
    "ip,kind",
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata service
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),  # carrier-grade NAT
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:10.0.0.1", "private"),  # IPv4-mapped
        ("2002:a00:1::", "private"),  # 6to4 around 10.0.0.1
        ("8.8.8.8", None),
        ("93.184.216.34", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_kind(ip, kind):
    assert address_kind(ipaddress.ip_address(ip)) == kind


def test_allowlist_by_address_network_and_name():
    p = AddressPolicy(allow_hosts=("127.0.0.1", "10.0.0.0/8", "intranet.local"))
    assert p.refusal("127.0.0.1", ipaddress.ip_address("127.0.0.1")) is None
    assert p.refusal("x", ipaddress.ip_address("10.20.30.40")) is None
    assert p.refusal("intranet.local", ipaddress.ip_address("192.168.0.7")) is None
    refusal = p.refusal("router", ipaddress.ip_address("192.168.0.1"))
    assert refusal is not None and "router (resolves to 192.168.0.1): private address" in refusal
    assert p.refusal("x", ipaddress.ip_address("127.0.0.2")) is not None  # only the listed address
    assert AddressPolicy(allow_private=True).refusal("x", ipaddress.ip_address("10.0.0.1")) is None


@pytest.fixture
def connects(monkeypatch):
    """Every socket connect this process attempts, recorded (and passed through)."""
    seen: list = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        seen.append(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        seen.append(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return seen


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/",
        "http://192.168.1.1:8080/admin",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://0.0.0.0/",
        "http://2130706433/",  # 127.0.0.1 written as one number
        "https://127.1/",
    ],
)
async def test_private_urls_are_refused_without_any_traffic(url, connects):
    tool = BrowserTool(BrowserConfig())
    r = await tool(url)
    await tool.aclose()
    assert not r.ok and r.metadata["reason"] == "blocked", r.error
    assert "refused to fetch" in r.error and "allow_hosts" in r.error
    assert connects == []


async def test_hostname_resolving_to_loopback_is_refused_and_the_server_sees_nothing(site, connects):
    tool = BrowserTool(BrowserConfig())  # default: nothing private allowed
    r = await tool(f"http://localhost:{site.port}/article")
    await tool.aclose()
    assert not r.ok and r.metadata["reason"] == "blocked"
    assert "localhost (resolves to" in r.error and "loopback address" in r.error
    assert connects == [] and site.hits == {}


async def test_allowed_address_connects_and_the_spy_sees_it(site, cfg, connects):
    # Positive control for the spy above: an allowed fetch does connect.
    tool = BrowserTool(cfg)
    r = await tool(site.url("/article"))
    await tool.aclose()
    assert r.ok and ("127.0.0.1", site.port) in connects


async def test_redirect_to_a_private_address_is_refused_before_connecting(site, cfg, connects):
    tool = BrowserTool(cfg)
    r = await tool(site.url("/to-private"))
    await tool.aclose()
    assert not r.ok and r.metadata["reason"] == "blocked"
    assert "10.0.0.1" in r.error
    assert all(addr[0] == "127.0.0.1" for addr in connects)


async def test_allowlisted_hostname_is_fetched(site):
    tool = BrowserTool(BrowserConfig(allow_hosts=["localhost"]))
    r = await tool(f"http://localhost:{site.port}/article")
    await tool.aclose()
    assert r.ok, r.error


async def test_resolver_refuses_at_connect_time():
    # What the connector itself gets when a name turns private between check and connect.
    resolver = GuardedResolver(AddressPolicy())
    with pytest.raises(BlockedAddress, match="loopback"):
        await resolver.resolve("localhost", 80)
    assert await GuardedResolver(AddressPolicy(allow_hosts=("localhost",))).resolve("localhost", 80)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "javascript:alert(1)", "http://", "gopher://x"])
async def test_only_http_and_https(url, connects):
    tool = BrowserTool(BrowserConfig())
    r = await tool(url)
    assert not r.ok and r.metadata["reason"] == "bad_url", r.error
    assert connects == []
