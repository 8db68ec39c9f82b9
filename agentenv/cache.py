"""The user's cache (`$AGENTENV_CACHE`, default `~/.cache/agentenv`): folders built once, whole or not at all.

`build_once(final, build)` builds a folder into a temporary sibling and renames
it into place under an exclusive file lock, so concurrent processes never see a
half-written folder and only one of them builds: the others wait, then find it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "AGENTENV_CACHE"


def cache_root() -> Path:
    """`$AGENTENV_CACHE` or `~/.cache/agentenv`."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "agentenv"


@contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive `flock` on `path` (created with its folder); blocks while another process holds it.

    Args:
        path: The lock file.
        on_wait: Called once when the lock is held by someone else (to say why we wait).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(
    final: Path,
    build: Callable[[Path], object],  # its result is ignored
    *,
    force: bool = False,
    on_wait: Callable[[], None] | None = None,
) -> Path:
    """`final`, built by `build(tmp_folder)` first if it does not exist yet (or `force`).

    The folder appears by one atomic rename after `build` returns, so its
    existence means it is complete; a build that raises leaves nothing behind.
    """
    if final.exists() and not force:
        return final
    with file_lock(final.with_name(final.name + ".lock"), on_wait):
        if final.exists() and not force:  # built by another process while we waited
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
        try:
            build(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final
