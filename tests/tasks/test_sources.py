"""Task sources by name: jsonl, parquet (verl/ARPO), hf (any local dataset through `datasets`), module:attr."""

from __future__ import annotations

import json

import pytest

from agentenv.errors import ConfigError
from agentenv.loader import build_dataclass
from agentenv.tasks.sources import TasksConfig, gsm8k_answer

GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"},
    {"question": "Weng earns $12 an hour. How much did she earn for 50 minutes?",
     "answer": "12/60 = $<<12/60=0.2>>0.2 per minute.\n50 * 0.2 = $<<0.2*50=10>>10.\n#### 10"},
    {"question": "A shop sold 1,200 apples on Monday and 800 on Tuesday. How many apples?",
     "answer": "1,200 + 800 = 2,000\n#### 2,000"},
]  # fmt: skip


def tasks(section: dict, overrides: dict | None = None):
    return build_dataclass(TasksConfig, {**section, **(overrides or {})}, "env.tasks").load()


@pytest.fixture(scope="module")
def gsm8k_files(tmp_path_factory):
    """The same three GSM8K rows as a parquet, a JSONL and a CSV file, and a `save_to_disk` folder."""
    import datasets

    root = tmp_path_factory.mktemp("gsm8k")
    ds = datasets.Dataset.from_list(GSM8K)
    ds.to_parquet(str(root / "train.parquet"))
    ds.to_json(str(root / "train.jsonl"))
    ds.to_csv(str(root / "train.csv"), index=False)
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(root / "saved"))
    return root


@pytest.mark.parametrize("name", ["train.parquet", "train.jsonl", "train.csv", "saved"])
def test_hf_source_reads_gsm8k_from_files_and_folders(gsm8k_files, name, tmp_path):
    section = {"source": "hf", "path": str(gsm8k_files / name), "answer_extractor": "gsm8k", "ability": "math",
               "cache_dir": str(tmp_path / "hf-cache"), "system_prompt": "Answer in \\boxed{}."}  # fmt: skip
    out = tasks(section, {"eval_split": "test"} if name == "saved" else None)
    assert [t.ground_truth for t in out.train] == ["72", "10", "2000"]
    t = out.train[0]
    assert t.ability == "math" and t.question == GSM8K[0]["question"] and t.messages[0]["role"] == "system"
    assert t.metadata["answers"] == ["72"] and t.id.endswith("-train-0")
    assert [x.ground_truth for x in out.heldout] == (["72"] if name == "saved" else [])


def test_hf_source_column_map_regex_extractor_and_limits(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "solution": f"It is {2 * i}. Answer: {2 * i}"} for i in range(6)]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    section = {"source": "hf", "path": str(path), "question": "prompt", "answer": "solution", "id": "id",
               "answer_extractor": r"Answer: (\d+)", "cache_dir": str(tmp_path / "c"), "limit": 4}  # fmt: skip
    out = tasks(section)
    assert [(t.id, t.ground_truth) for t in out.train] == [("q0", "0"), ("q1", "2"), ("q2", "4"), ("q3", "6")]
    assert out.train[0].ability == "qa" and len(out.train[0].messages) == 1
    with pytest.raises(ConfigError, match=r"env\.tasks\.question: .* has no column 'question' \(columns: id, prompt, solution\)"):
        tasks({**section, "question": "question"})
    with pytest.raises(ConfigError, match=r"env\.tasks\.answer_extractor: the regular expression 'Answer' needs a group"):
        tasks({**section, "answer_extractor": "Answer"})
    with pytest.raises(ConfigError, match=r"env\.tasks: source 'hf' failed: .* row 0: .*does not match"):
        tasks({**section, "answer_extractor": r"Final: (\d+)"})
    with pytest.raises(ConfigError, match=r"env\.tasks\.path: no file or folder at"):
        tasks({**section, "path": str(tmp_path / "missing.parquet")})
    with pytest.raises(ConfigError, match=r"env\.tasks\.path: is required"):
        tasks({"source": "hf"})


def test_gsm8k_answer():
    assert gsm8k_answer("so 3 + 4 = 7\n#### 7") == "7"
    assert gsm8k_answer("#### 1,234") == "1234"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_answer("7")


def test_jsonl_and_parquet_sources(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    out = tasks({"source": "jsonl", "path": str(path), "eval_path": str(path), "system_prompt": "Be brief."})
    assert out.train[0].ground_truth == "4" and out.train[0].messages[0]["content"] == "Be brief." and len(out.heldout) == 1
    verl = tasks({"source": "parquet", "path": "/work/shared/data/arpo/valid.parquet", "limit": 5})
    assert len(verl.train) == 5 and verl.train[0].metadata["source"] == "verl"
    # Another format's system prompt replaces the rows' own (ARPO's describes tags); a prefill ends each task.
    mine = tasks({"source": "parquet", "path": "/work/shared/data/arpo/valid.parquet", "limit": 5,
                  "system_prompt": "Use <tool_call>.", "prefill": "<tool_call>"})  # fmt: skip
    roles = [m["role"] for m in mine.train[0].messages]
    assert roles == ["system", "user", "assistant"], roles
    assert mine.train[0].messages[0]["content"] == "Use <tool_call>." and mine.train[0].messages[-1]["content"] == "<tool_call>"
    assert mine.train[0].messages[1] == verl.train[0].messages[-1]
    with pytest.raises(ConfigError, match=r"env\.tasks\.path: '.*nope\.jsonl' does not exist"):
        tasks({"source": "jsonl", "path": str(tmp_path / "nope.jsonl")})
    with pytest.raises(ConfigError, match=r"env\.tasks\.eval_path: '.*' is a folder, not a file"):
        tasks({"source": "parquet", "path": "/work/shared/data/arpo/valid.parquet", "eval_path": str(tmp_path)})
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"env\.tasks\.path: '.*bad\.jsonl' cannot be read as tasks: .*not valid JSON"):
        tasks({"source": "jsonl", "path": str(tmp_path / "bad.jsonl")})
    with pytest.raises(ConfigError, match=r"env\.tasks\.pth: unknown key .*did you mean 'path'"):
        tasks({"source": "jsonl", "pth": "x"})
