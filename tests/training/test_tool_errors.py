"""A tool that fails never passes silently: counted per tool and kind, warned of, and a run it breaks stops.

The python tool is made to refuse every call (`env.tools.python.max_code_bytes=1`),
as a misconfiguration would; the rollout policy is scripted so that every
episode calls it, and the trainer, the env and the sandbox are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.configs import config_from_dict
from agentenv.errors import TrainingStopped
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.build import build_runtime
from agentenv.training.metrics import read_metrics
from agentenv.training.trainer import Trainer

pytestmark = pytest.mark.docker

REFUSING_PYTHON = [
    "env.tools={python: {max_code_bytes: 1, pool_size: 1}}",
    "env.tasks.kinds=[arith]",
    "trainer.max_failed_steps=2",
]


def _trainer(overrides: list[str]) -> Trainer:
    cfg = config_from_dict({}, overrides)
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))

    def turn(prompt_ids: list[int]) -> str:
        text = rt.tokenizer.decode(prompt_ids)
        return "<answer>\\boxed{0}</answer>" if "code too large" in text else "<python>print(1 + 1)</python>"

    rt.policy = ScriptedPolicy(rt.tokenizer, turn)
    return Trainer(cfg, runtime=rt)


def test_a_refusing_tool_is_counted_warned_of_and_stops_the_run(fast_overrides, capsys):
    overrides = fast_overrides + REFUSING_PYTHON + ["trainer.steps=4", "trainer.eval_every=1"]
    trainer = _trainer(overrides)
    with pytest.raises(TrainingStopped, match="the python tool failed most of its calls in 2 consecutive steps") as ei:
        trainer.train()
    assert "refused" in str(ei.value) and "code too large" in str(ei.value)

    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning: the python tool failed" in line]
    # the evaluations at steps 0, 1 and 2 and steps 1 and 2 (the health check after step 2 stops the run): a line each
    assert len(warnings) == 5, err
    assert "in the evaluation at step 0" in warnings[0] and "commonest: refused" in warnings[0], warnings[0]
    assert "code too large" in warnings[0]

    records = read_metrics(Path(trainer.cfg.trainer.output_dir) / "metrics.jsonl")
    first_eval = next(r for r in records if r["step"] == 0)
    assert first_eval["eval/tool_errors/python/refused"] == first_eval["eval/tool_calls/python"] > 0
    assert first_eval["eval/tool_failed/python"] == 1.0
    step1 = next(r for r in records if r["step"] == 1 and "rollout/reward" in r)
    assert step1["rollout/tool_errors/python/refused"] == step1["rollout/tool_calls/python"] == 4  # 2 tasks x 2
    assert step1["rollout/tool_errors/python/timeout"] == 0 and step1["rollout/tool_failed/python"] == 1.0
    assert [r["step"] for r in records if "rollout/reward" in r] == [1, 2]  # stopped at step 2 of 4


def test_the_eval_json_holds_each_tools_calls_and_errors(fast_overrides):
    overrides = fast_overrides + REFUSING_PYTHON + ["trainer.steps=1", "trainer.max_failed_steps=5"]
    trainer = _trainer(overrides)
    trainer.train()
    report = json.loads((Path(trainer.cfg.trainer.output_dir) / "eval.json").read_text())
    python = report["tools"]["python"]
    assert python["calls"] == 2 and python["errors"] == {"refused": 2} and python["failed_share"] == 1.0
