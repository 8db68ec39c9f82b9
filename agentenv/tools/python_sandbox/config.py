"""The Python sandbox's one validated config."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from agentenv.errors import ConfigError

SandboxMode = Literal["stateless", "session"]

_MiB = 1024 * 1024

DEFAULT_WARMUP = """\
import numpy as np
np.linalg.det(np.eye(3)); np.linalg.solve(np.eye(3), np.ones(3)); np.random.default_rng(0).random(3)
import sympy as sp
x, y = sp.symbols("x y")
sp.factor(x**2 - 1); sp.expand((x + y)**3); sp.solve([x + y - 2, x - y], [x, y])
sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)
sp.integrate(x**2, (x, 0, 1)); sp.diff(sp.exp(x) * x, x); sp.Rational(1, 3) + sp.Rational(1, 6); sp.N(sp.pi, 20)
sp.isprime(97); sp.factorint(360); sp.Matrix([[1, 2], [3, 4]]).det(); sp.sqrt(8); sp.latex(x**2)
"""
_KEY = "python_sandbox"


@dataclass(frozen=True)
class PythonSandboxConfig:
    """How model-written Python runs: image, pool, limits, output cut.

    Attributes:
        image: Docker image the containers run. `build_image` builds it offline
            from Debian packages (python3, numpy, sympy) when it is missing.
        pull_image: Image `build_image` tries to pull (and tag as `image`)
            before building offline; None skips the pull.
        pull_timeout_s: Give up pulling after this long (no registry here).
        debian_suite: Debian release debootstrap builds the image from.
        debian_mirror: Debian mirror debootstrap downloads from.
        pool_size: Warm containers started once and reused.
        mode: `stateless`: every call starts clean (the paper's tool).
            `session`: variables persist across one episode's calls like
            notebook cells, and `fork()` copies the live state (ARPO branching).
        timeout_s: Wall-clock limit of one call; the call's processes are
            killed when it passes.
        memory_mb: Memory limit of each container (no swap).
        address_space_factor: Each call's virtual memory is capped at this
            many times `memory_mb`, so a huge allocation fails at once with a
            MemoryError instead of an OOM kill after a second of thrashing;
            0 turns the cap off.
        pids_limit: Most processes (threads included) of one stateless call, or
            of one session with its forks (RLIMIT_NPROC of the episode's uid). The
            container's limit is derived: `container_pids_limit`.
        sessions_per_container: Most sessions (each with its forks) one
            container holds at once, stateless calls on a session-mode pool
            included; an open that finds every container full waits up to
            `start_timeout_s` for a slot.
        cpus: CPU quota of each container, in cores.
        workdir_size_mb: Size of the writable tmpfs work dir (`/work`); it
            counts against `memory_mb`.
        output_head_bytes: Bytes kept from the start of stdout and of stderr.
        output_tail_bytes: Bytes kept from the end of stdout and of stderr
            (the traceback tail survives the cut).
        output_limit_bytes: A call that prints more than this in all is
            stopped and reported as "output too large".
        max_code_bytes: Longer code is refused before it reaches the sandbox.
        preload: Modules the runner imports once at start, so that a call's
            `import numpy` costs nothing (missing ones are skipped).
        warmup: Code the runner runs once at start, after `preload` (output
            dropped, errors ignored), so that a call's first use of common numpy
            and sympy functions does not pay for their lazy set-up.
        print_last_expr: Print the value of a trailing expression, as a
            notebook does (the ARPO paper's tool does too).
        start_timeout_s: Most time a new container may take to answer, and a
            new session may wait for a free slot.
        docker_timeout_s: Timeout of one Docker API request.
        label: Label key every container carries; `close` and the next start
            remove containers carrying it.
    """

    image: str = "agentenv/python-sandbox:bookworm"
    pull_image: str | None = "python:3.11-slim"
    pull_timeout_s: float = 20.0
    debian_suite: str = "bookworm"
    debian_mirror: str = "http://deb.debian.org/debian"
    pool_size: int = 4
    mode: SandboxMode = "stateless"
    timeout_s: float = 10.0
    memory_mb: int = 512
    address_space_factor: float = 2.0
    pids_limit: int = 64
    sessions_per_container: int = 16
    cpus: float = 1.0
    workdir_size_mb: int = 64
    output_head_bytes: int = 4096
    output_tail_bytes: int = 4096
    output_limit_bytes: int = 16 * _MiB
    max_code_bytes: int = 256 * 1024
    preload: tuple[str, ...] = ("numpy", "sympy")
    warmup: str = DEFAULT_WARMUP
    print_last_expr: bool = True
    start_timeout_s: float = 60.0
    docker_timeout_s: float = 60.0
    label: str = "agentenv.sandbox"

    def __post_init__(self) -> None:
        if not self.image or not isinstance(self.image, str):
            raise ConfigError(f"{_KEY}.image", f"must be a non-empty image name, got {self.image!r}")
        for key, (lo, hi, integer) in _RANGES.items():
            check_range(f"{_KEY}.{key}", getattr(self, key), lo, hi, integer=integer)
        if self.address_space_factor != 0 and self.address_space_factor < 1:
            raise ConfigError(
                f"{_KEY}.address_space_factor", f"must be 0 (off) or >= 1, got {self.address_space_factor!r}"
            )
        if self.output_head_bytes + self.output_tail_bytes == 0:
            raise ConfigError(
                f"{_KEY}.output_head_bytes", "output_head_bytes + output_tail_bytes must be > 0, got 0 + 0"
            )
        cut = self.output_head_bytes + self.output_tail_bytes
        if self.output_limit_bytes < cut:
            raise ConfigError(
                f"{_KEY}.output_limit_bytes",
                f"{self.output_limit_bytes} must be >= output_head_bytes + output_tail_bytes = {cut}",
            )
        if self.workdir_size_mb >= self.memory_mb:
            raise ConfigError(
                f"{_KEY}.workdir_size_mb",
                f"{self.workdir_size_mb} MiB must be below memory_mb {self.memory_mb} MiB (the tmpfs counts against it)",
            )
        if isinstance(self.preload, str):
            object.__setattr__(self, "preload", (self.preload,))
        else:
            object.__setattr__(self, "preload", tuple(self.preload))
        for mod in self.preload:
            if not re.fullmatch(r"[A-Za-z_][\w.]*", mod):
                raise ConfigError(f"{_KEY}.preload", f"{mod!r} is not a module name")
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.label):
            raise ConfigError(f"{_KEY}.label", f"must be a lowercase docker label key, got {self.label!r}")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * _MiB

    @property
    def container_pids_limit(self) -> int:
        """Room for every episode a container holds at its own limit, a standby and the runner's own."""
        return self.pids_limit * (self.sessions_per_container + 2) + 16


# key -> (lowest, highest, int?): every number of the config has a finite range, so a value
# such as 1e12 CPUs or an infinite timeout is refused here, not by Docker or the runner later.
_DAY_S = 86400.0
_RANGES: dict[str, tuple[float, float, bool]] = {
    "pool_size": (1, 256, True),
    "memory_mb": (64, 1 << 22, True),
    "pids_limit": (8, 4096, True),
    "sessions_per_container": (1, 256, True),
    "workdir_size_mb": (1, 1 << 22, True),
    "output_head_bytes": (0, 1 << 30, True),
    "output_tail_bytes": (0, 1 << 30, True),
    "output_limit_bytes": (1, 1 << 40, True),
    "max_code_bytes": (1, 1 << 30, True),
    "timeout_s": (0.001, _DAY_S, False),
    "pull_timeout_s": (0.001, _DAY_S, False),
    "start_timeout_s": (0.001, _DAY_S, False),
    "docker_timeout_s": (1.0, _DAY_S, False),
    "cpus": (0.01, 1024, False),
    "address_space_factor": (0, 1024, False),
}


def check_range(key: str, value: object, lo: float, hi: float, *, integer: bool = False) -> None:
    """Raises a ConfigError naming `key` and `value` unless `value` is a finite number (an int if
    `integer`) in [lo, hi]. NaN and infinity fail it: they pass the comparisons they should fail."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or not lo <= value <= hi:
        kind = "an int" if integer else "a finite number"
        raise ConfigError(key, f"must be {kind} in [{lo:g}, {hi:g}], got {value!r}")


def call_timeout(timeout_s: float | None, cfg: PythonSandboxConfig) -> float:
    """One call's timeout: `timeout_s` (checked like the config's) or the config's `timeout_s`."""
    if timeout_s is None:
        return float(cfg.timeout_s)
    lo, hi, _ = _RANGES["timeout_s"]
    check_range("timeout_s", timeout_s, lo, hi)
    return float(timeout_s)
