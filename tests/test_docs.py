"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing page
or a docstring reference that does not resolve fails the test suite, not only the docs.

mkdocs and its plugins come with the `docs` extra (`pip install -e '.[docs]'`); they read
the code statically (griffe), so the build imports nothing heavy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "No module named mkdocs" not in out, "mkdocs is missing: pip install -e '.[docs]'"
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        line for line in out.splitlines() if not line.startswith("INFO")
    )
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()


def test_the_readme_links_resolve():
    """The front page's relative links (into docs/ and the code) point at files the repository has."""
    import re

    text = (ROOT / "README.md").read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    links = [m for m in re.findall(r"\]\(([^)\s]+)\)", prose) if not re.match(r"[a-z]+://|#", m)]
    assert links, "the README links into the documentation"
    missing = [m for m in links if not (ROOT / m.split("#")[0]).exists()]
    assert not missing, f"README links to files the repository does not have: {missing}"
    assert "bash scripts/test.sh" in text  # .ci/run's command is the README's
