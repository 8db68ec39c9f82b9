"""scripts/requirements_met.py: a second `scripts/setup.sh` skips pip only when every requirement is met."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "requirements_met.py"


def met(extras: str, pyproject: Path | None = None) -> int:
    env = dict(os.environ, **({"AGENTENV_PYPROJECT": str(pyproject)} if pyproject else {}))
    return subprocess.run([sys.executable, str(SCRIPT), extras], env=env, timeout=60).returncode


def test_this_checkout_as_set_up_needs_nothing():
    assert met("dev,docs") == 0  # the test command ran setup.sh on this checkout


def test_a_requirement_not_installed_or_too_old_sends_setup_to_pip(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    missing = tmp_path / "missing.toml"
    missing.write_text(text.replace('docs = [', 'docs = ["no-such-package-agentenv-test>=1", ', 1))
    assert met("docs", missing) == 1
    old = tmp_path / "old.toml"
    old.write_text(text.replace('"pyyaml>=6.0"', '"pyyaml>=999"', 1))
    assert met("", old) == 1


def test_an_entry_point_added_since_the_install_sends_setup_to_pip(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    added = tmp_path / "added.toml"
    added.write_text(text.replace('[project.scripts]\n', '[project.scripts]\nagentenv-test-new = "agentenv.cli:main"\n', 1))
    assert added.read_text() != text and met("", added) == 1
    assert met("", ROOT / "pyproject.toml") == 0


def test_lists_which_of_the_named_packages_are_installed():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--installed", "pyyaml", "no-such-package-agentenv-test"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()
    assert out == ["pyyaml"]


def test_pinned_is_met_only_by_those_exact_versions_all_installed():
    from importlib import metadata

    yaml = f"pyyaml=={metadata.version('pyyaml')}"

    def pinned(*reqs: str) -> int:
        return subprocess.run([sys.executable, str(SCRIPT), "--pinned", *reqs], timeout=60).returncode

    assert pinned(yaml) == 0
    assert pinned(yaml, "pyyaml==0.0.1") == 1  # installed at another version: setup.sh would change it, so it pips
    assert pinned(yaml, "no-such-package-agentenv-test==1.0") == 1  # a partial install: the rest still comes
