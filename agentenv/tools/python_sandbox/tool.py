"""`PythonTool`: the `python` tool of the Tool protocol, backed by a SandboxPool."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping
from typing import Any

from agentenv.loader import build_dataclass
from agentenv.tools.python_sandbox.config import PythonSandboxConfig
from agentenv.tools.python_sandbox.pool import ExecResult, SandboxPool, SandboxSession, SessionLost
from agentenv.types import ToolErrorKind, ToolResult

_FRESH = "a fresh session starts with the next call, so define your variables again"
_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def clean_code(query: str) -> str:
    """The code inside `<python>...</python>`: a markdown fence around it is dropped."""
    m = _FENCE.match(query)
    return m.group(1) if m else query.strip("\n")


def to_tool_result(r: ExecResult, cfg: PythonSandboxConfig, latency_s: float = 0.0) -> ToolResult:
    """What the model reads: stdout, then stderr (traceback tail), then why it stopped.

    `r` is checked first: a field of the wrong type (it came from inside the
    container) gives an error result, never an exception."""
    if not isinstance(r, ExecResult):
        r = ExecResult(error=f"the sandbox gave no result ({type(r).__name__})")
    r = r.checked()
    reason = None
    kind: ToolErrorKind = "agent"  # the code ran and failed on its own, unless a branch below says otherwise
    note = None  # a line for the model when the reason is not already in stderr
    if r.timed_out:
        kind = "timeout"
        reason = f"timeout after {cfg.timeout_s:g} s"
        note = f"TimeoutError: the code ran longer than {cfg.timeout_s:g} s and was stopped"
        if r.session_lost:  # the model must learn both: its variables are gone too
            reason += "; session lost"
            note += f"\nSessionError: {r.error or 'session lost'}; {_FRESH}"
    elif r.output_limit:
        reason = "output too large"
        note = f"OutputError: the code printed more than {cfg.output_limit_bytes} bytes and was stopped"
    elif r.oom:
        reason = f"out of memory (limit {cfg.memory_mb} MiB)"
        note = f"MemoryError: the code used more than {cfg.memory_mb} MiB and was killed"
    elif r.session_lost:
        reason, kind = "session lost", "sandbox"
        note = f"SessionError: {r.error or reason}; {_FRESH}"
    elif r.signal is not None:
        reason = f"killed by {_signal_name(r.signal)}"
        note = f"the code's process was {reason}"
    elif r.error:
        reason = r.error
        if r.exit_code is None:  # the runner could not run it at all: nothing in stderr says why
            note, kind = r.error, "sandbox"
    elif r.exit_code not in (0, None):
        reason = f"exit status {r.exit_code}"
    parts = [p for p in (r.stdout, r.stderr) if p]
    text = "".join(p if p.endswith("\n") else p + "\n" for p in parts)
    if note:
        text += note + "\n"
    if r.rolled_back:
        text += "(the session's variables are as they were before this call)\n"
    return ToolResult(
        text=text.rstrip("\n"),
        ok=reason is None,
        error=reason,
        latency_s=latency_s,
        kind=kind if reason is not None else None,
        metadata={
            "exit_code": r.exit_code,
            "signal": r.signal,
            "timed_out": r.timed_out,
            "oom": r.oom,
            "output_limit": r.output_limit,
            "stdout_bytes": r.stdout_bytes,
            "stderr_bytes": r.stderr_bytes,
            "sandbox_s": r.duration_s,
            "container": r.container,
            "rolled_back": r.rolled_back,
            "session_lost": r.session_lost,
        },
    )


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class PythonTool:
    """Runs model-written Python in the Docker sandbox (`<python>code</python>`).

    A prototype built from a config owns its pool (started on the first call)
    and closes it in `aclose`. `fork()` gives a tool that shares the pool: in
    stateless mode a plain view, in session mode a copy of the live session
    (a fresh empty session if this tool has none yet). A fork's `aclose` frees
    only its own session.

    Args:
        config: Sandbox settings (mode, limits, image). Defaults to `PythonSandboxConfig()`.
        pool: A pool to share instead of creating one; the caller closes it.
    """

    name = "python"
    description = "Run Python code in a sandbox and read what it prints (stdout, then stderr)."
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python code; print() what you need to read."}},
        "required": ["code"],
    }

    def __init__(self, config: PythonSandboxConfig | None = None, *, pool: SandboxPool | None = None):
        if pool is not None and config is not None and config is not pool.config:
            raise ValueError("pass either config or pool (the pool carries its own config)")
        self._owns_pool = pool is None
        self.pool = pool or SandboxPool(config or PythonSandboxConfig())
        self.config = self.pool.config
        self._session: SandboxSession | None = None
        self._closed = False

    @property
    def mode(self) -> str:
        return self.config.mode

    async def __call__(self, query: str) -> ToolResult:
        t0 = time.monotonic()
        code = clean_code(query)
        n = len(code.encode("utf-8", "surrogatepass"))
        if not code.strip():
            return ToolResult(text="Error: no code to run", ok=False, error="empty code", kind="refused")
        if n > self.config.max_code_bytes:
            why = f"code too large: {n} bytes > limit {self.config.max_code_bytes} bytes"
            return ToolResult(text=f"Error: {why}", ok=False, error=why, kind="refused")
        r: ExecResult | ToolResult
        if self.config.mode == "stateless":
            r = await self.pool.run(code)
        else:
            r = await self._run_in_session(code)
            if isinstance(r, ToolResult):
                r.latency_s = time.monotonic() - t0
                return r
        return to_tool_result(r, self.config, time.monotonic() - t0)

    async def _run_in_session(self, code: str) -> ExecResult | ToolResult:
        try:
            if self._session is None or self._session.closed:
                self._session = await self.pool.open_session()
            r = await self._session.run(code)
        except SessionLost as e:
            self._session = None
            return ToolResult(text=f"SessionError: {e}; {_FRESH}", ok=False, error="session lost", kind="sandbox")
        if r.session_lost:
            self._session = None
        return r

    async def health_check(self) -> None:
        """Runs `print(1)` in every container of the pool (started if needed).

        Raises:
            ToolError: a container did not print 1, or the pool cannot start; the message names why.
        """
        await self.pool.health_check()

    def fork(self) -> PythonTool:
        """An independent copy: shares the pool, copies the session's variables."""
        twin = PythonTool(pool=self.pool)
        if self.config.mode == "session" and self._session is not None and not self._session.closed:
            twin._session = self._session.fork()
        return twin

    async def aclose(self) -> None:
        """Frees this tool's session; the prototype that built the pool also closes it."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.aclose()
        if self._owns_pool:
            await self.pool.aclose()


def make_python_tool(cfg: PythonSandboxConfig | Mapping[str, Any] | None = None, **options: Any) -> PythonTool:
    """The `python` tool a config asks for (a prototype that owns its pool).

    Also the entry point of `agentenv/Python-v0`: `gymnasium.make("agentenv/Python-v0",
    mode="session", timeout_s=5)` passes its keyword arguments here. Nothing touches
    Docker until the first call.

    Args:
        cfg: The validated config, or a mapping of its fields.
        **options: Fields of `PythonSandboxConfig` (merged over a mapping `cfg`).

    Raises:
        ConfigError: An unknown option or a bad value (names the key and the value).
    """
    if cfg is None or isinstance(cfg, Mapping):
        cfg = build_dataclass(PythonSandboxConfig, {**(cfg or {}), **options}, "python_sandbox")
    elif options:
        raise TypeError(
            f"make_python_tool got a PythonSandboxConfig and options {sorted(options)}; pass one or the other"
        )
    return PythonTool(cfg)
