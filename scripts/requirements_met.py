"""Whether this checkout of agentenv is installed with every requirement of the given extras met (exit 0), so
that a second `scripts/setup.sh` skips pip; with `--installed NAME...`, prints which of NAME are installed; with
`--pinned NAME==VERSION...`, exit 0 when every one is installed at exactly that version.

    python3 scripts/requirements_met.py dev,hf     # exit 0: nothing to install
    python3 scripts/requirements_met.py --installed torchvision torchaudio
    python3 scripts/requirements_met.py --pinned verifiers==0.3.1 openenv-core==0.3.0
"""

from __future__ import annotations

import os
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = Path(os.environ.get("AGENTENV_PYPROJECT", ROOT / "pyproject.toml"))  # another file: for the tests


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def pinned(reqs: list[str]) -> bool:
    """Every `name==version` installed at that version (a check in milliseconds, where importing them takes seconds)."""
    for req in reqs:
        name, _, version = req.partition("==")
        try:
            if metadata.version(name) != version:
                return False
        except metadata.PackageNotFoundError:
            return False
    return True


def met(extras: list[str]) -> bool:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh environment: nothing is installed yet
        return False

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    try:
        dist = metadata.distribution(project["name"])
    except metadata.PackageNotFoundError:
        return False
    if dist.version != project["version"]:
        return False
    where = dist.read_text("direct_url.json") or ""
    if ROOT.as_uri() not in where:  # installed, but from another checkout
        return False
    # A command or entry point added since the install is only registered by installing again.
    declared = {("console_scripts", name, value) for name, value in project.get("scripts", {}).items()}
    declared |= {("gui_scripts", name, value) for name, value in project.get("gui-scripts", {}).items()}
    declared |= {(group, n, v) for group, points in project.get("entry-points", {}).items() for n, v in points.items()}
    if not declared <= {(e.group, e.name, e.value) for e in dist.entry_points}:
        return False
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"].get(extra, [])
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return False
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            return False
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--installed"]:
        print(" ".join(n for n in sys.argv[2:] if installed(n)))
        sys.exit(0)
    if sys.argv[1:2] == ["--pinned"]:
        sys.exit(0 if pinned(sys.argv[2:]) else 1)
    sys.exit(0 if met([e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e]) else 1)
