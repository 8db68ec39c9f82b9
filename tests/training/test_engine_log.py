"""The engine log: engine processes and vLLM's logger write to a file, agentenv's own lines stay on the terminal."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from agentenv.training.engine_log import EngineLog

# A stand-in for vLLM's engine-core process: writes to the stdout and stderr it inherits, now and later.
_CHILD = (
    "import sys, time\n"
    "print('child stdout at start', flush=True); print('child stderr at start', file=sys.stderr, flush=True)\n"
    "sys.stdin.readline()\n"
    "print('child stdout later', flush=True); print('child stderr later', file=sys.stderr, flush=True)\n"
)


def _wait_for(path, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text()
        if text in content:
            return content
        time.sleep(0.05)
    return path.read_text()


def test_processes_started_inside_write_to_the_log_for_their_life(tmp_path, capfd):
    log = EngineLog(tmp_path / "run" / "engine.log")
    with log.capture():
        child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, text=True)
        print("noise while the engine starts")
    print("agentenv's own line")
    try:
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    text = _wait_for(log.path, "child stderr later")
    for line in ("child stdout at start", "child stderr at start", "noise while the engine starts",
                 "child stdout later", "child stderr later"):
        assert line in text
    out, err = capfd.readouterr()
    assert "agentenv's own line" in out and "agentenv's own line" not in text
    assert "child" not in out + err and "noise" not in out + err
    log.close()


@pytest.mark.parametrize("library", ["vllm", "transformers", "accelerate"])
def test_library_loggers_go_to_the_log_until_close(tmp_path, capfd, library):
    from transformers.utils import logging as hf_logging

    root = logging.getLogger(library)
    terminal = logging.StreamHandler(sys.stderr)
    before = (list(root.handlers), root.propagate)
    root.handlers = [terminal]  # as vLLM and transformers configure theirs: own handler, no propagation
    root.propagate = False
    try:
        log = EngineLog(tmp_path / "engine.log")
        with log.capture():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # checkpoint writing draws no bar
        logging.getLogger(f"{library}.engine").warning("engine says hello")
        log.close()
        assert hf_logging.is_progress_bar_enabled()
        logging.getLogger(f"{library}.engine").warning("after close")
        text = (tmp_path / "engine.log").read_text()
        _, err = capfd.readouterr()
        assert "engine says hello" in text and "engine says hello" not in err
        assert "after close" in err and "after close" not in text
        assert root.handlers == [terminal]
    finally:
        root.handlers, root.propagate = before


def test_a_handler_made_inside_the_capture_outlives_the_closed_file(tmp_path, capfd):
    """vLLM configures its logging when first imported, with `ext://sys.stdout`: inside the capture that is the
    log file, so an engine that outlives the run (shared by several) must not log into the closed file."""
    root = logging.getLogger("vllm")
    before = (list(root.handlers), root.propagate)
    try:
        log = EngineLog(tmp_path / "engine.log")
        with log.capture():
            root.handlers = [logging.StreamHandler(sys.stdout)]  # sys.stdout: the log file, here
            root.propagate = False
        logging.getLogger("vllm.engine").warning("during the run")
        log.close()
        logging.getLogger("vllm.engine").warning("after the run")
        out, err = capfd.readouterr()
        assert "during the run" in (tmp_path / "engine.log").read_text()
        assert "after the run" in out and "Logging error" not in err
    finally:
        root.handlers, root.propagate = before


def test_verbose_changes_nothing(capfd):
    log = EngineLog(None)
    with log.capture():
        print("engine noise, shown")
    log.close()
    out, _ = capfd.readouterr()
    assert "engine noise, shown" in out


def test_a_failed_start_points_at_the_log(tmp_path, capfd):
    log = EngineLog(tmp_path / "engine.log")
    with pytest.raises(RuntimeError, match="engine died"):
        with log.capture():
            print("Traceback of the engine")
            raise RuntimeError("engine died")
    log.close()
    _, err = capfd.readouterr()
    assert f"the engine's output is in {tmp_path / 'engine.log'}" in err
    assert "Traceback of the engine" in (tmp_path / "engine.log").read_text()
