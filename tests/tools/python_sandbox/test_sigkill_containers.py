"""The containers of a process killed with SIGKILL go with it, not at the next run's start.

A real process starts a real pool and is SIGKILLed; its reaper removes the
containers labelled with its owner id within seconds. The pool uses a label of
its own, so no other pool's start-up cleanup (other tests running meanwhile)
can be what removed them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

pytestmark = pytest.mark.docker

_OWNER = textwrap.dedent(
    """
    import asyncio, sys, time
    from agentenv.tools.python_sandbox import PythonSandboxConfig, SandboxPool

    pool = SandboxPool(PythonSandboxConfig(pool_size=2, label=sys.argv[1]))
    asyncio.run(pool.start())
    print(" ".join(pool.containers), flush=True)
    time.sleep(600)
    """
)


def test_containers_of_a_sigkilled_owner_are_removed(docker_client, sandbox_image):
    label = f"agentenv.test-reap-{uuid.uuid4().hex[:8]}"
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, label], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        ids = owner.stdout.readline().split()
        assert len(ids) == 2, owner.stderr.read() if owner.poll() is not None else ids
        assert all(docker_client.api.inspect_container(c)["State"]["Running"] for c in ids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()

    def left() -> list[str]:
        return [c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"{label}=1"})]

    end = time.monotonic() + 20
    while left() and time.monotonic() < end:
        time.sleep(0.3)
    remaining = left()
    for cid in remaining:  # never leave them behind
        docker_client.api.remove_container(cid, force=True)
    assert not remaining, f"containers outlived their SIGKILLed owner: {remaining}"
