"""Index folders saved beside a corpus: written whole or not at all, one builder at a time."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_manifest(index_dir: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when missing or unreadable (a folder without one is never trusted)."""
    try:
        manifest: dict[str, Any] = json.loads((index_dir / "manifest.json").read_text())
        return manifest
    except (OSError, ValueError):
        return None


def publish(index_dir: Path, write: Callable[[Path], None], manifest: dict[str, Any]) -> bool:
    """Write an index into a temporary folder, add its manifest last, then rename it into place.

    Returns False (and logs) when the folder cannot be written; the index then lives in memory only.
    """
    tmp: Path | None = None
    try:
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=index_dir.name + ".tmp-", dir=index_dir.parent))
        write(tmp)
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        if index_dir.exists():
            old = index_dir.with_name(f"{index_dir.name}.old-{os.getpid()}")
            os.replace(index_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, index_dir)
        return True
    except OSError as e:
        log.warning("could not save index to %s (%s); it stays in memory only", index_dir, e)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return False


@contextmanager
def locked(index_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Exclusive lock on `<index_dir>.lock`: one process builds, the others wait and then load."""
    if not enabled:
        yield
        return
    try:
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(index_dir.with_name(index_dir.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield  # read-only folder: nothing will be saved there anyway
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
