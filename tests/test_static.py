"""The linter and the type checker, as configured in pyproject.toml, report nothing: the linter on the whole
repository (the package, its tests, benchmarks and scripts), the type checker on agentenv/.

Both are in the `dev` extra; a missing one fails this test (it is part of the suite, not optional).
mypy keeps its incremental cache in the repository's .mypy_cache (gitignored).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_reports_nothing():
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff is not installed: pip install -e '.[dev]'"
    out = _run(ruff, "check", ".", timeout=120)  # the package, its tests, benchmarks and scripts
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_reports_nothing():
    try:
        import mypy  # noqa: F401  (only asks whether it is installed)
    except ImportError as e:
        raise AssertionError("mypy is not installed: pip install -e '.[dev]'") from e
    out = _run(sys.executable, "-m", "mypy", timeout=600)  # files, flags and cache dir: [tool.mypy] in pyproject.toml
    assert out.returncode == 0, out.stdout + out.stderr
