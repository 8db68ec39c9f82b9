"""Every page the browser cannot read says whose fault it is (`ToolResult.kind`), over real HTTP on 127.0.0.1."""

from __future__ import annotations

from agentenv.tools.browser import BrowserTool


async def test_each_failure_has_the_kind_of_its_cause(site, cfg):
    tool = BrowserTool(cfg)
    try:
        cases = {
            "": "refused",  # an empty query
            "not a url at all": "refused",
            f"{site.url('/stall')} | anything": "timeout",  # the server never answers
            f"{site.url('/binary')} | anything": "agent",  # a page the browser cannot read, chosen by the agent
            "file:///etc/passwd | a local file": "refused",  # only http and https are fetched
        }
        for query, kind in cases.items():
            r = await tool(query)
            assert not r.ok and r.kind == kind, (query, r.kind, r.error)
        ok = await tool(f"{site.url('/article')} | anything")
        assert ok.ok and ok.kind is None
    finally:
        await tool.aclose()
