"""JSONL and verl/ARPO parquet loaders, on the published ARPO data and on hand-written files."""

from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agentenv.tasks.loaders as loaders
from agentenv.tasks.loaders import load_jsonl, load_verl_parquet, repair_escapes
from agentenv.tasks.prompts import ARPO_SYSTEM_PROMPT

DATA = "/work/shared/data/arpo"


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(loaders, "_warned", False)


def test_valid_parquet(fresh_warning, caplog):
    with caplog.at_level(logging.WARNING, logger="agentenv.tasks.loaders"):
        tasks = load_verl_parquet(f"{DATA}/valid.parquet")
        load_verl_parquet(f"{DATA}/valid.parquet")
    assert len(tasks) == 180
    assert sum(t.ability == "math" for t in tasks) == 100 and sum(t.ability == "qa" for t in tasks) == 80
    assert len({t.id for t in tasks}) == 180
    t = tasks[0]
    assert t.id == "DR_grpo_mix-valid-0"
    assert t.messages[0] == {"role": "system", "content": ARPO_SYSTEM_PROMPT}
    assert t.question == "Who is older, William Henry Rodes Green or Eleanor Of Lancaster?"
    assert t.ground_truth == "Eleanor Of Lancaster" and t.metadata["answers"] == ["Eleanor Of Lancaster"]
    assert t.metadata["split"] == "valid" and t.metadata["reward_style"] == "rule" and t.metadata["index"] == 0
    assert tasks[-1].ground_truth == "1+274i" and tasks[-1].ability == "math"
    assert not any("\x08" in m["content"] for t in tasks for m in t.messages)
    # Warned once, naming the defect, although the file was read twice.
    warnings = [r for r in caplog.records if "repaired" in r.getMessage()]
    assert len(warnings) == 1 and "\\x08" in warnings[0].getMessage() and "boxed" in warnings[0].getMessage()


def test_train_10k_head_and_full_load_time():
    head = load_verl_parquet(f"{DATA}/train_10k.parquet", limit=7)
    assert [t.id for t in head] == [f"DR_grpo_mix-train-{i}" for i in range(7)]
    assert head[0].ground_truth == "3\\sqrt{3} - 6" and head[1].ground_truth == "Chattahoochee National Forest"
    t0 = time.perf_counter()
    tasks = load_verl_parquet(f"{DATA}/train_10k.parquet")
    elapsed = time.perf_counter() - t0
    assert len(tasks) == 10_000 and elapsed < 5.0, elapsed
    assert [t.question for t in tasks[:7]] == [t.question for t in head]
    # "\frac" that became a form feed is put back; the ligature form feeds elsewhere are left alone.
    assert not any("\x0crac" in t.question for t in tasks)
    assert any("\\frac{m}{n}" in t.question and "in the form" in t.question for t in tasks)


def test_repair_escapes():
    assert repair_escapes("\x08oxed{1} and \x0crac{1}{2}") == ("\\boxed{1} and \\frac{1}{2}", 2)
    assert repair_escapes("in\x0cfinite") == ("in\x0cfinite", 0)
    assert repair_escapes("plain") == ("plain", 0)


def _write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def _row(gt, ability="qa", index=0):
    return {
        "data_source": "hotpot",
        "prompt": [{"role": "system", "content": "Use \x08oxed{}."}, {"role": "user", "content": "Q?"}],
        "ability": ability,
        "reward_model": {"ground_truth": gt, "style": "rule"},
        "extra_info": {"index": index, "question": "Q?", "split": "test"},
    }


def test_parquet_list_ground_truth_and_ability_map(tmp_path):
    path = tmp_path / "d.parquet"
    _write_parquet(path, [_row(["Paris", "City of Paris"], "fact-reasoning", 3)])
    with pytest.raises(ValueError, match=r"d.parquet row 0: ability 'fact-reasoning'"):
        load_verl_parquet(path)
    (t,) = load_verl_parquet(path, ability_map={"fact-reasoning": "qa"})
    assert t.id == "hotpot-test-3" and t.ground_truth == "Paris"
    assert t.metadata["answers"] == ["Paris", "City of Paris"]
    assert t.messages[0]["content"] == "Use \\boxed{}."
    (raw,) = load_verl_parquet(path, ability_map={"fact-reasoning": "qa"}, repair=False)
    assert raw.messages[0]["content"] == "Use \x08oxed{}."


def test_parquet_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_verl_parquet(tmp_path / "none.parquet")
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["x"]}), path)
    with pytest.raises(ValueError, match="missing columns"):
        load_verl_parquet(path)
    _write_parquet(path, [_row("a"), _row(None, index=1)])
    with pytest.raises(ValueError, match="row 1: reward_model.ground_truth"):
        load_verl_parquet(path)
    assert len(load_verl_parquet(path, limit=1)) == 1
    assert load_verl_parquet(path, limit=0) == []


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_jsonl_records(tmp_path):
    path = tmp_path / "tasks.jsonl"
    _write_jsonl(path, [
        {"id": "a", "question": "What is 2+2?", "answer": 4, "ability": "math"},
        "",
        {"messages": [{"role": "user", "content": "Capital of France?"}], "ground_truth": ["Paris", "paris city"],
         "metadata": {"hops": 1}},
    ])  # fmt: skip
    a, b = load_jsonl(path, system_prompt="SYS")
    assert a.id == "a" and a.ground_truth == "4" and a.ability == "math"
    assert a.messages == ({"role": "system", "content": "SYS"}, {"role": "user", "content": "What is 2+2?"})
    assert b.id == "tasks-3" and b.ability == "qa" and b.ground_truth == "Paris"
    assert b.metadata == {"hops": 1, "answers": ["Paris", "paris city"]}
    assert len(b.messages) == 1


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"answer": "x"}', "needs 'messages' or"),
        ('{"question": "q"}', "needs 'ground_truth'"),
        ('{"question": "q", "answer": "x", "ability": "poetry"}', "ability 'poetry'"),
        ('{"messages": [{"role": "user"}], "answer": "x"}', "'messages' must be"),
        ('{"question": "q", "answer": "x", "metadata": 3}', "'metadata' must be an object"),
        ('{"id": "t1", "question": "q", "answer": "x"}', "id 't1' already used on line 1"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, ['{"id": "t1", "question": "ok", "answer": "y"}', line])
    with pytest.raises(ValueError, match=match) as err:
        load_jsonl(path)
    assert f"{path}:2:" in str(err.value)
