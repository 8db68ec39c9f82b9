"""Imports point one way (DESIGN.md): tools <- envs <- rollout <- algorithms <- training <- cli.

tasks and policies are leaves that envs and rollout use; the toy world stands
above them and nothing below imports it. Checked on every module's imports,
those inside functions included (`if TYPE_CHECKING:` blocks excepted).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "agentenv"

BASE = {"errors", "types", "registry", "loader", "cache", "_reaper", "_loops"}  # _reaper, _loops: used by tools (sandbox), envs and policies (vLLM)
# layer -> the layers its modules may import (besides their own and BASE)
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "tools": set(),
    "tasks": set(),
    "policies": set(),
    "envs": {"tools", "tasks", "policies"},
    "rollout": {"envs", "tools", "tasks", "policies"},
    "algorithms": {"rollout", "envs", "tools", "tasks", "policies"},
    "toy": {"rollout", "envs", "tools", "tasks", "policies"},
    "configs": {"algorithms", "rollout", "envs", "tools", "tasks", "policies"},
    "training": {"configs", "algorithms", "rollout", "envs", "tools", "tasks", "policies"},
    "bench": {"training", "configs", "algorithms", "rollout", "envs", "tools", "tasks", "policies"},
}
TOP = {"__init__", "__main__", "cli"}  # the package root and the command stand above everything


def layer(module: str) -> str:
    """`agentenv.envs.agent_env` -> `envs`; the base modules -> `base`."""
    head = module.split(".")[1] if module.count(".") else ""
    return "base" if head in BASE else head


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `agentenv` import in a file, outside `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("agentenv.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentenv.") and not node.level:
            out += [(node.lineno, node.module)]
    return out


def test_imports_point_one_way():
    bad = []
    modules = 0
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        src = rel.parts[0].removesuffix(".py")
        if src in TOP:
            continue
        modules += 1
        here = layer(f"agentenv.{src}")
        assert here in ALLOWED, f"{rel}: module of no known layer {here!r}; add it to DESIGN.md and ALLOWED"
        for line, mod in imports(path):
            there = layer(mod)
            if there not in ("base", here) and there not in ALLOWED[here]:
                bad.append(f"agentenv/{rel}:{line} ({here}) imports {mod} ({there})")
    assert modules > 80
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_check_sees_an_upward_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from agentenv.toy.tasks import KINDS\n\nif TYPE_CHECKING:\n    import agentenv.training.trainer\n")
    assert imports(f) == [(2, "agentenv.toy.tasks")]
    assert layer("agentenv.toy.tasks") not in ALLOWED["tools"] | {"tools"}


def test_outside_agent_tool_and_task_packages_load_only_when_asked():
    """`import agentenv` and a run config that names none of them import no openai, mcp, reasoning_gym or
    aiohttp server; the endpoint's recorder and config import no server either."""
    import subprocess
    import sys

    code = (
        "import sys, agentenv, agentenv.configs, agentenv.rollout, agentenv.tools.registry, agentenv.tasks\n"
        "import agentenv.rollout.endpoint.recorder, agentenv.tools.mcp.config\n"
        "from agentenv.configs import config_from_dict\n"
        "config_from_dict({})\n"
        "print(sorted(m for m in ('openai', 'mcp', 'reasoning_gym', 'aiohttp.web') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
