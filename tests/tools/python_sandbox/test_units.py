"""Parts that need no daemon: config validation, the runner's pure helpers, result text."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentenv.errors import ConfigError
from agentenv.tools.python_sandbox import ExecResult, PythonSandboxConfig, clean_code, runner, to_tool_result


@pytest.mark.parametrize(
    ("kwargs", "key", "shown"),
    [
        ({"mode": "notebook"}, "mode", "'notebook'"),
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


def test_from_dict_suggests_the_closest_key():
    with pytest.raises(ConfigError, match="did you mean timeout_s"):
        PythonSandboxConfig.from_dict({"timout_s": 1})
    cfg = PythonSandboxConfig.from_dict({"mode": "session", "preload": ["numpy"]})
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
