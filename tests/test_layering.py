"""Imports point one way (docs/architecture.md): tools <- envs <- rollout <- algorithms <- training <- cli.

tasks and policies are leaves that envs and rollout use; the toy world stands
above them and nothing below imports it. Checked on every module's imports,
those inside functions included (`if TYPE_CHECKING:` blocks excepted).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "agentenv"

# _reaper, _loops: used by tools (sandbox), envs and policies (vLLM)
BASE = {"errors", "types", "registry", "loader", "cache", "_reaper", "_loops"}
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
    "distributed": {"rollout", "envs", "tools", "tasks", "policies"},
    "configs": {"algorithms", "rollout", "envs", "tools", "tasks", "policies"},
    "training": {"distributed", "configs", "algorithms", "rollout", "envs", "tools", "tasks", "policies"},
    "bench": {"training", "distributed", "configs", "algorithms", "rollout", "envs", "tools", "tasks", "policies"},
    "view": {"bench", "training", "distributed", "configs", "algorithms", "rollout", "envs", "tools", "tasks", "policies"},
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
        assert here in ALLOWED, f"{rel}: module of no known layer {here!r}; add it to docs/architecture.md and ALLOWED"
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


def _import_graph() -> dict[str, set[str]]:
    """module -> the agentenv modules it imports (function-level imports included), parent packages left out."""
    names = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        names[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        out = set()
        for _, mod in imports(path):
            while mod and mod not in names:  # `from agentenv.x import y` where y is not a module
                mod = mod.rpartition(".")[0]
            if mod and mod != name and not name.startswith(mod + "."):
                out.add(mod)
        graph[name] = out
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    """No two modules import each other, even through others or inside functions (the bench's
    runner, report and plots once did: their shared types now live in agentenv.bench.results)."""
    assert _cycles(_import_graph()) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_shared_plumbing_is_in_the_base_layer():
    """The event-loop thread and the sync guard live in one base module that tools, envs and policies use."""
    assert layer("agentenv._loops") == "base"
    graph = _import_graph()
    users = {m for m, out in graph.items() if "agentenv._loops" in out}
    assert {"agentenv.envs.toolloop", "agentenv.envs.sync", "agentenv.tools.python_sandbox.pool",
            "agentenv.policies.vllm.policy", "agentenv.policies.hf"} <= users
