"""Model-written Python in a Docker sandbox: a warm pool, hard limits, forkable sessions.

Nothing here imports `docker` until a pool starts or an image is built.

    from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool, build_image

    build_image(PythonSandboxConfig())           # once: `agentenv sandbox build`
    tool = PythonTool(PythonSandboxConfig(mode="session"))
    episode = tool.fork()                        # a fresh session
    await episode("x = 41")
    branch = episode.fork()                      # copies x
    (await branch("x + 1")).text                 # '42'
"""

from agentenv.tools.python_sandbox.config import PythonSandboxConfig, SandboxMode
from agentenv.tools.python_sandbox.image import build_image
from agentenv.tools.python_sandbox.pool import ExecResult, SandboxPool, SandboxSession, SessionLost
from agentenv.tools.python_sandbox.tool import PythonTool, clean_code, make_python_tool, to_tool_result

__all__ = [
    "ExecResult",
    "PythonSandboxConfig",
    "PythonTool",
    "SandboxMode",
    "SandboxPool",
    "SandboxSession",
    "SessionLost",
    "build_image",
    "clean_code",
    "make_python_tool",
    "to_tool_result",
]
