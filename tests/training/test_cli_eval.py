"""`agentenv eval`: the report is printed and written, into folders made as needed; a bad --out fails first."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from agentenv.cli import app


def test_eval_writes_its_report_into_a_new_folder(fast_overrides, tmp_path):
    out = tmp_path / "reports" / "nested" / "eval.json"
    res = CliRunner().invoke(app, ["eval", "configs/toy_grpo.yaml", *fast_overrides, "--tasks", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["n_tasks"] == 2 and 0.0 <= report["accuracy"] <= 1.0
    assert json.loads(res.output[res.output.index("{") :]) == report


def test_eval_refuses_a_directory_as_out_before_evaluating(fast_overrides, tmp_path):
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["eval", "configs/toy_grpo.yaml", *fast_overrides, "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "--out" in res.output and "is a directory" in res.output
    assert time.monotonic() - t0 < 30  # no evaluation ran
