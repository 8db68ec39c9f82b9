"""Parts that need no daemon: config validation, the runner's pure helpers, result text."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from agentenv.errors import ConfigError
from agentenv.tools.python_sandbox import (
    ExecResult,
    PythonSandboxConfig,
    clean_code,
    make_python_tool,
    runner,
    to_tool_result,
)


@pytest.mark.parametrize(
    ("kwargs", "key", "shown"),
    [
        ({"pool_size": 0}, "pool_size", "0"),
        ({"timeout_s": -1}, "timeout_s", "-1"),
        ({"memory_mb": 512, "workdir_size_mb": 600}, "workdir_size_mb", "600 MiB must be below memory_mb 512"),
        (
            {"output_limit_bytes": 100},
            "output_limit_bytes",
            "100 must be >= output_head_bytes + output_tail_bytes = 8192",
        ),
        ({"sessions_per_container": 0}, "sessions_per_container", "0"),
        ({"preload": ["numpy", "os; rm"]}, "preload", "'os; rm'"),
        ({"address_space_factor": 0.5}, "address_space_factor", "0.5"),
    ],
)
def test_bad_values_name_key_and_value(kwargs, key, shown):
    with pytest.raises(ConfigError) as e:
        PythonSandboxConfig(**kwargs)
    assert e.value.key == f"python_sandbox.{key}" and shown in str(e.value)


def test_a_mode_outside_its_literal_is_refused_where_options_are_read():
    with pytest.raises(ConfigError) as e:
        make_python_tool(mode="notebook")  # the loader checks Literal choices (the config class does not again)
    assert e.value.key == "python_sandbox.mode" and "'notebook'" in str(e.value) and "'session'" in str(e.value)


def test_options_suggest_the_closest_key():
    with pytest.raises(ConfigError, match="did you mean 'timeout_s'"):
        make_python_tool(timout_s=1)
    cfg = make_python_tool({"mode": "session", "preload": ["numpy"]}).config
    assert cfg.mode == "session" and cfg.preload == ("numpy",)


def test_importing_agentenv_and_the_sandbox_does_not_import_docker():
    code = "import sys, agentenv, agentenv.tools.python_sandbox as p; p.PythonTool(); print('docker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_compile_cell_splits_the_last_expression():
    ns = runner.fresh_ns()
    body, expr = runner.compile_cell("a = 2\na * 21")
    exec(body, ns)
    assert eval(expr, ns) == 42
    assert runner.compile_cell("a = 2")[1] is None
    assert runner.compile_cell("a", print_last=False)[1] is None


def test_run_cell_reports_errors_in_one_line(capsys):
    ns = runner.fresh_ns()
    assert runner.run_cell("x = 1\nx + 1", ns) == (0, None)
    assert capsys.readouterr().out == "2\n"
    code, err = runner.run_cell("def f():\n    raise KeyError('k')\nf()", ns)
    tb = capsys.readouterr().err
    assert code == 1 and err == "KeyError: 'k'"
    assert 'File "<cell>", line 2, in f' in tb and "runner.py" not in tb
    assert runner.run_cell("print(", ns)[1] == "SyntaxError: '(' was never closed (line 1)"
    assert runner.run_cell("import sys; sys.exit(0)", ns) == (0, None)
    assert runner.run_cell("import sys; sys.exit(4)", ns) == (4, "SystemExit: 4")
    assert ns["x"] == 1  # the namespace carries over, like notebook cells


def test_capture_keeps_head_and_tail():
    cap = runner.Capture(4, 3)
    for chunk in (b"abcdef", b"ghij", b"klmnop"):
        cap.add(chunk)
    assert cap.total == 16
    assert cap.text() == "abcd\n[... 9 bytes cut ...]\nnop"
    small = runner.Capture(4, 3)
    small.add(b"abcdefg")
    assert small.text() == "abcdefg"
    bad = runner.Capture(10, 10)
    bad.add(b"ok \xff")
    assert bad.text() == "ok \ufffd"


def test_clean_code_drops_a_markdown_fence():
    assert clean_code("```python\nprint(1)\n```") == "print(1)"
    assert clean_code("```\nx = 1\ny = 2```") == "x = 1\ny = 2"
    assert clean_code("\nprint(1)\n") == "print(1)"
    assert clean_code("s = '```'") == "s = '```'"


def test_tool_result_text_and_reasons():
    cfg = PythonSandboxConfig(timeout_s=3)
    ok = to_tool_result(ExecResult(stdout="1\n", exit_code=0), cfg)
    assert ok.ok and ok.text == "1" and ok.error is None
    exc = to_tool_result(ExecResult(stderr="Traceback ...\nValueError: v\n", exit_code=1, error="ValueError: v"), cfg)
    assert not exc.ok and exc.error == "ValueError: v" and exc.text == "Traceback ...\nValueError: v"
    slow = to_tool_result(ExecResult(stdout="partial\n", signal=9, timed_out=True, rolled_back=True), cfg)
    assert slow.error == "timeout after 3 s"
    assert slow.text.splitlines() == [
        "partial",
        "TimeoutError: the code ran longer than 3 s and was stopped",
        "(the session's variables are as they were before this call)",
    ]
    oom = to_tool_result(ExecResult(signal=9, oom=True), cfg)
    assert oom.error == "out of memory (limit 512 MiB)" and oom.text.startswith("MemoryError")
    killed = to_tool_result(ExecResult(signal=15), cfg)
    assert killed.error == "killed by SIGTERM"
    lost = to_tool_result(ExecResult(session_lost=True, error="session lost: its process died"), cfg)
    assert lost.error == "session lost" and "define your variables again" in lost.text


GOOD_REPLY = {
    "id": 1, "ok": True, "exit": 0, "signal": None, "timed_out": False, "output_limit": False, "oom": False,
    "error": None, "stdout": "1\n", "stderr": "", "stdout_bytes": 2, "stderr_bytes": 0, "duration": 0.004,
}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stdout", ["not", "text"]),
        ("stderr", 7),
        ("exit", "0"),
        ("exit", True),
        ("exit", 1 << 70),
        ("signal", 9.0),
        ("timed_out", "no"),
        ("oom", 1),
        ("error", ["x"]),
        ("duration", "fast"),
        ("duration", float("nan")),
        ("duration", -1.0),
        ("stdout_bytes", [1]),
        ("stderr_bytes", None),
        ("rolled_back", {}),
        ("session_lost", "yes"),
    ],
)
def test_a_reply_field_of_the_wrong_type_is_an_error_result(key, value):
    r = ExecResult.from_reply({**GOOD_REPLY, key: value}, "c0ffee")
    assert not r.ok and r.exit_code is None and r.container == "c0ffee"
    field = {"exit": "exit_code", "duration": "duration_s"}.get(key, key)
    assert r.error == f"the sandbox sent a malformed reply (bad {field})"
    out = to_tool_result(r, PythonSandboxConfig())
    assert not out.ok and isinstance(out.text, str) and "malformed reply" in out.text


def test_replies_that_are_not_results_are_error_results():
    assert ExecResult.from_reply(GOOD_REPLY, "c").ok
    for reply, error in (
        ([1, 2], "the sandbox sent a malformed reply (list)"),
        ("text", "the sandbox sent a malformed reply (str)"),
        ({"id": 1, "ok": False, "fail": "session lost"}, "session lost"),
        ({"id": 1, "ok": False, "fail": {"a": 1}}, "the sandbox refused the call"),
        ({**GOOD_REPLY, "ok": "true"}, "the sandbox refused the call"),
    ):
        r = ExecResult.from_reply(reply, "c")
        assert not r.ok and r.error == error


def test_to_tool_result_never_raises_on_a_malformed_result():
    bad = ExecResult(stdout=b"bytes", stderr=None, exit_code="0", signal="KILL", error=["x"], duration_s="1")
    out = to_tool_result(bad, PythonSandboxConfig())
    assert not out.ok and out.error.startswith("the sandbox sent a malformed reply (bad stdout, stderr, exit_code")
    assert to_tool_result(None, PythonSandboxConfig()).error == "the sandbox gave no result (NoneType)"


def test_a_timeout_that_also_lost_the_session_says_both():
    r = ExecResult(stdout="x\n", signal=9, timed_out=True, session_lost=True, error="session lost: it did not recover")
    out = to_tool_result(r, PythonSandboxConfig(timeout_s=3))
    assert out.error == "timeout after 3 s; session lost"
    assert out.text.splitlines() == [
        "x",
        "TimeoutError: the code ran longer than 3 s and was stopped",
        "SessionError: session lost: it did not recover; a fresh session starts with the next call, "
        "so define your variables again",
    ]


def test_the_host_stream_drops_lines_it_cannot_match_to_a_request():
    import concurrent.futures

    from agentenv.tools.python_sandbox.pool import _Channel

    ch = _Channel("c" * 64, None, None, None)
    fut = concurrent.futures.Future()
    ch.pending[3] = fut
    for line in (b"not json", b"[1]", b'{"id": [3]}', b'{"id": true}', b'{"id": "3"}', b'{"no": "id"}', b"null"):
        ch._dispatch(line)  # logged and dropped, never raised
    assert not fut.done()
    ch._dispatch(b'{"id": 3, "ok": true}')
    assert fut.result() == {"id": 3, "ok": True}


def test_the_runner_checks_a_status_from_user_code():
    assert runner.checked_status({"exit": 0, "error": None}) == (0, None)
    assert runner.checked_status({"exit": 1, "error": "ValueError: v"}) == (1, "ValueError: v")
    for forged in ({"exit": "0"}, {"exit": True}, {"exit": None, "error": ["x"]}, [1], {"exit": 1 << 40}):
        exit_code, error = runner.checked_status(forged)
        assert exit_code is None and isinstance(error, str)



def test_a_jobs_written_status_wins_over_its_exit_read_first():
    """The zygote's word that a job exited can be read before the job's status pipe (both
    are ready in one batch of events): the status it wrote still names the error."""
    fds: list[int] = []

    def job(written: bytes, *, close: bool = True, read_first: bytes = b"") -> runner.Run:
        run = runner.Run({"id": 1}, None, 10_001)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.write(w, written)
        if close:
            os.close(w)
        else:
            fds.append(w)
        fds.append(r)
        run.status_fd, run.status = r, read_first
        return run

    memory = json.dumps({"exit": 1, "error": "MemoryError"}).encode()
    assert job(memory).ended(1) == (1, "MemoryError")  # its exit came first
    assert job(memory[7:], read_first=memory[:7]).ended(1) == (1, "MemoryError")  # half was read
    assert job(memory).ended(None) == (1, "MemoryError")  # killed after it wrote
    assert job(json.dumps({"exit": 300, "error": "SystemExit: 300"}).encode()).ended(44) == (300, "SystemExit: 300")
    assert job(b"", close=False).ended(1) == (1, None)  # nothing written, the pipe still held open
    assert job(b"").ended(None) == (None, None)  # killed before it wrote
    assert job(memory[:9]).ended(None) == (None, None)  # cut short by the kill
    flood = job(b"", read_first=b"{" * (runner.STATUS_MAX + 1))  # on_status read past the limit
    assert flood.ended(1) == (1, None)  # a flood is no status
    assert job(b'{"exit": "1"}').ended(1) == (1, "the call's process sent a malformed status")
    for fd in fds:
        os.close(fd)


async def test_a_full_pool_says_which_setting_to_raise():
    from types import SimpleNamespace

    from agentenv.errors import ToolError
    from agentenv.tools.python_sandbox import SandboxPool

    pool = SandboxPool(PythonSandboxConfig(mode="session", sessions_per_container=2, start_timeout_s=0.2))
    pool._channels = [SimpleNamespace(closed=False, load=2)]  # one live container, both slots taken
    pool._changed = asyncio.Event()
    t0 = time.monotonic()
    with pytest.raises(ToolError, match="1 containers x 2 sessions are open.*sessions_per_container"):
        await pool._place()
    assert 0.2 <= time.monotonic() - t0 < 1.0
