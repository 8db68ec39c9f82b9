"""The sandbox image: use it if present, else pull one, else build it offline.

The offline build needs no registry: debootstrap downloads Debian packages
(python3, numpy, sympy) into a directory, which is tarred and imported with
`docker import`. It runs as root and takes a minute or more, once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from agentenv.errors import ToolError
from agentenv.tools.python_sandbox._docker import docker_client, image_exists
from agentenv.tools.python_sandbox.config import PythonSandboxConfig

DEBIAN_PACKAGES = ("python3-minimal", "python3-numpy", "python3-sympy")
# Baked into the image: no thread pools in numpy (they would break `fork` and
# exceed the pids limit), UTF-8 everywhere.
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV OPENBLAS_NUM_THREADS=1",
    "ENV OMP_NUM_THREADS=1",
    "WORKDIR /work",
)


def build_image(cfg: PythonSandboxConfig | None = None, *, log: Callable[[str], None] = print) -> str:
    """Makes sure `cfg.image` exists in the Docker daemon; returns its name.

    Idempotent: an existing image is used as is. Otherwise `cfg.pull_image` is
    pulled (bounded by `cfg.pull_timeout_s`) and tagged as `cfg.image`; if that
    fails, the image is built offline with debootstrap and `docker import`.
    Concurrent callers on one machine serialize on a file lock.

    Raises:
        ToolError: no daemon answers, or neither pulling nor building worked.
    """
    cfg = cfg or PythonSandboxConfig()
    client = docker_client(cfg.docker_timeout_s)
    if image_exists(client, cfg.image):
        log(f"sandbox image {cfg.image} already present")
        return cfg.image
    with _build_lock():
        if image_exists(client, cfg.image):  # another process built it while we waited
            log(f"sandbox image {cfg.image} already present")
            return cfg.image
        if cfg.pull_image and _try_pull(client, cfg, log):
            return cfg.image
        _debootstrap_build(client, cfg, log)
    return cfg.image


def _try_pull(client: Any, cfg: PythonSandboxConfig, log: Callable[[str], None]) -> bool:
    """Pulls `cfg.pull_image` in a thread so a hung registry costs at most pull_timeout_s."""
    image = cast(str, cfg.pull_image)  # the caller pulls only when set
    repo, _, tag = (
        image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    )
    log(f"pulling {repo}:{tag} (at most {cfg.pull_timeout_s:.0f} s)...")
    outcome: dict[str, Any] = {}

    def pull() -> None:
        try:
            outcome["image"] = client.images.pull(repo, tag=tag)
        except Exception as e:  # APIError, timeouts: the registry is unreachable
            outcome["error"] = e

    t = threading.Thread(target=pull, daemon=True)
    t.start()
    t.join(cfg.pull_timeout_s)
    if "image" not in outcome:
        why = outcome.get("error", f"no answer in {cfg.pull_timeout_s:.0f} s")
        log(f"pull failed ({str(why).splitlines()[0][:200]}); building offline instead")
        return False
    new_repo, _, new_tag = cfg.image.rpartition(":")
    outcome["image"].tag(new_repo or cfg.image, tag=new_tag or "latest")
    log(f"pulled {repo}:{tag} and tagged it {cfg.image} (note: it has no numpy/sympy)")
    return True


def _debootstrap_build(client: Any, cfg: PythonSandboxConfig, log: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise ToolError(
            f"sandbox image {cfg.image!r} is missing, the pull failed and debootstrap is not installed: "
            "apt-get install -y debootstrap, then run `agentenv sandbox build` again"
        )
    if os.geteuid() != 0:
        raise ToolError(
            f"building sandbox image {cfg.image!r} with debootstrap needs root: run `sudo agentenv sandbox build`"
        )
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentenv-sandbox-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            cfg.debian_suite,
            str(root),
            cfg.debian_mirror,
        ]
        log(f"building {cfg.image} offline: {' '.join(cmd)} (a minute or more)")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise ToolError(f"debootstrap failed (exit {proc.returncode}); is {cfg.debian_mirror} reachable?\n{tail}")
        _slim(root)
        tar_path = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
        repo, _, tag = cfg.image.rpartition(":")
        log(f"importing {tar_path.stat().st_size / 2**20:.0f} MiB rootfs as {cfg.image}...")
        client.api.import_image(
            src=str(tar_path), repository=repo or cfg.image, tag=tag or "latest", changes=list(IMAGE_CHANGES)
        )
    if not image_exists(client, cfg.image):
        raise ToolError(f"docker import finished but image {cfg.image!r} is not listed")
    log(f"built {cfg.image} in {time.monotonic() - t0:.0f} s")


def _slim(root: Path) -> None:
    """Drops what a sandbox never needs (package caches, docs) to keep the image small."""
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info"):
        d = root / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    cache = Path(os.environ.get("AGENTENV_CACHE", Path.home() / ".cache" / "agentenv"))
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "sandbox-image.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
