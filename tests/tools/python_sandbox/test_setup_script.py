"""scripts/setup_docker.sh against a machine where a daemon already answers: it leaves it be."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "setup_docker.sh"


def test_script_is_valid_bash():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.docker
def test_idempotent_where_a_daemon_answers(docker_client):
    for _ in range(2):
        out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "a Docker daemon already answers; leaving it as it is" in out.stdout
        assert "starting dockerd" not in out.stdout and "installing" not in out.stdout
        assert out.stdout.rstrip().endswith("[setup_docker] done")
