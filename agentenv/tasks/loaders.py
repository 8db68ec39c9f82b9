"""Dataset loaders: JSONL task files and verl/ARPO parquet files -> `Task`s."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv.tasks.task import Ability, Task

log = logging.getLogger(__name__)

# Control characters that a LaTeX escape turned into when the text went through a
# non-raw Python string: "\boxed" -> "\x08oxed", "\frac" -> "\x0crac". A backspace
# never means anything in a prompt, so it is always put back as "\b"; a form feed
# is repaired only before "rac" (elsewhere in the data it is a PDF ligature left over).
_ESCAPE_REPAIRS = {"\x08": "\\b", "\x0crac": "\\frac"}
_warned = False
_warn_lock = threading.Lock()


def repair_escapes(text: str) -> tuple[str, int]:
    """Put back LaTeX escapes that were turned into control characters.

    Returns:
        The repaired text and the number of characters repaired.
    """
    n = 0
    for bad, good in _ESCAPE_REPAIRS.items():
        if bad in text:
            n += text.count(bad)
            text = text.replace(bad, good)
    return text, n


def _warn_repaired(path: Path, n: int) -> None:
    """Say once per process that the data carried broken escapes."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    log.warning(
        "%s: repaired %d control characters that stood for LaTeX escapes (a backspace \\x08 where '\\b' of "
        "'\\boxed' was meant, a form feed \\x0c where '\\f' of '\\frac' was). The data was written through a "
        "non-raw string; this warning is shown once per process.",
        path,
        n,
    )


def _answers(value: Any) -> list[str]:
    """Ground truth as a list of strings (a scalar, a list or a numpy array)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):  # numpy array or scalar
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _ability(value: Any, ability_map: Mapping[str, Ability] | None, where: str) -> Ability:
    value = "qa" if value is None else str(value)
    if ability_map and value in ability_map:
        value = ability_map[value]
    if value not in ("math", "qa"):
        raise ValueError(f"{where}: ability {value!r} is neither 'math' nor 'qa'; pass ability_map to map it")
    return value


def load_jsonl(
    path: str | Path, system_prompt: str | None = None, ability_map: Mapping[str, Ability] | None = None
) -> list[Task]:
    """Load tasks from a JSONL file, one JSON object a line.

    Fields: `id` (default `<file stem>-<line>`), `messages` (chat messages) or
    `question` (a string, made the user message), `ground_truth` or `answer`
    (a string, number or list; a list's first item is the ground truth; all of
    them go to `metadata["answers"]`), `ability` (`math`/`qa`, default `qa`),
    `metadata` (an object). Blank lines are skipped.

    Args:
        path: The JSONL file.
        system_prompt: Put before the user message of records that give only `question`.
        ability_map: Maps other ability names (e.g. `fact-reasoning`) to `math`/`qa`.

    Raises:
        FileNotFoundError: No such file.
        ValueError: A bad record; the message names the file and the line.
    """
    path = Path(path)
    tasks: list[Task] = []
    ids: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            task = _jsonl_task(rec, where, f"{path.stem}-{lineno}", system_prompt, ability_map)
            if task.id in ids:
                raise ValueError(f"{where}: id {task.id!r} already used on line {ids[task.id]}")
            ids[task.id] = lineno
            tasks.append(task)
    return tasks


def _jsonl_task(
    rec: Any, where: str, default_id: str, system_prompt: str | None, ability_map: Mapping[str, Ability] | None
) -> Task:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        messages = rec["messages"]
        well_formed = all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ) if isinstance(messages, list) else False
        if not messages or not well_formed:
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
    elif isinstance(rec.get("question"), str) and rec["question"].strip():
        messages = [{"role": "user", "content": rec["question"]}]
        if system_prompt is not None:
            messages.insert(0, {"role": "system", "content": system_prompt})
    else:
        raise ValueError(f"{where}: needs 'messages' or a non-empty string 'question' (keys: {sorted(rec)})")
    truth = rec.get("ground_truth", rec.get("answer"))
    answers = _answers(truth)
    if not answers:
        raise ValueError(f"{where}: needs 'ground_truth' (or 'answer'), a string, number or non-empty list")
    metadata = rec.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: 'metadata' must be an object, got {type(metadata).__name__}")
    metadata = {**metadata, "answers": answers}
    return Task(
        id=str(rec.get("id", default_id)),
        messages=tuple(messages),
        ground_truth=answers[0],
        ability=_ability(rec.get("ability"), ability_map, where),
        metadata=metadata,
    )


def load_verl_parquet(
    path: str | Path,
    limit: int | None = None,
    ability_map: Mapping[str, Ability] | None = None,
    repair: bool = True,
) -> list[Task]:
    """Load tasks from a verl/ARPO parquet file.

    Columns: `data_source`, `prompt` (chat messages), `ability`, `reward_model`
    (`{ground_truth, style}`), `extra_info` (`{index, question, split, ...}`),
    optional `metadata`. Task ids are `<data_source>-<split>-<index>`. A list
    ground truth gives its first item as `ground_truth` and all in
    `metadata["answers"]`. Control characters that stand for LaTeX escapes (ARPO's
    system prompt has `\\x08oxed` for `\\boxed`) are repaired, with one warning
    per process.

    Args:
        path: The parquet file.
        limit: Read only the first `limit` rows.
        ability_map: Maps other ability names to `math`/`qa`.
        repair: Repair broken escapes (on by default).

    Raises:
        FileNotFoundError: No such file.
        ValueError: A required column is missing or a row is malformed (names file and row).
    """
    import pyarrow.parquet as pq  # lazy: only parquet users pay for pyarrow

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no parquet file at {path}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    pf = pq.ParquetFile(path)
    columns = set(pf.schema_arrow.names)
    missing = {"prompt", "reward_model"} - columns
    if missing:
        raise ValueError(f"{path}: not a verl parquet file, missing columns {sorted(missing)} (has {sorted(columns)})")
    table = pf.read() if limit is None else _head(pf, limit)
    rows = table.to_pylist()
    tasks: list[Task] = []
    repaired = 0
    for i, row in enumerate(rows):
        task, n = _verl_task(row, f"{path} row {i}", i, ability_map, repair)
        tasks.append(task)
        repaired += n
    if repaired:
        _warn_repaired(path, repaired)
    return tasks


def _head(pf: Any, limit: int) -> Any:
    """The first `limit` rows, reading only the batches needed."""
    import pyarrow as pa

    batches, n = [], 0
    if limit:
        for batch in pf.iter_batches(batch_size=min(limit, 1024)):
            batches.append(batch)
            n += batch.num_rows
            if n >= limit:
                break
    return pa.Table.from_batches(batches, schema=pf.schema_arrow).slice(0, limit)


def _verl_task(
    row: dict[str, Any], where: str, rownum: int, ability_map: Mapping[str, Ability] | None, repair: bool
) -> tuple[Task, int]:
    repaired = 0

    def fix(text: str) -> str:
        nonlocal repaired
        if not repair:
            return text
        text, n = repair_escapes(text)
        repaired += n
        return text

    prompt = row.get("prompt")
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not prompt:
        raise ValueError(f"{where}: 'prompt' must be a non-empty list of chat messages, got {type(prompt).__name__}")
    messages = []
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: every prompt message needs string 'role' and 'content', got {m!r}")
        messages.append({"role": m["role"], "content": fix(m["content"])})
    reward_model = row.get("reward_model") or {}
    answers = [fix(a) for a in _answers(reward_model.get("ground_truth"))]
    if not answers:
        raise ValueError(f"{where}: reward_model.ground_truth is missing or empty")
    extra = dict(row.get("extra_info") or {})
    if isinstance(extra.get("question"), str):
        extra["question"] = fix(extra["question"])
    data_source = row.get("data_source") or "verl"
    split = extra.get("split") or "data"
    index = extra.get("index", rownum)
    metadata: dict[str, Any] = {
        "source": "verl",
        "data_source": data_source,
        "split": split,
        "index": index,
        "reward_style": reward_model.get("style"),
        "extra_info": extra,
        "answers": answers,
    }
    if isinstance(row.get("metadata"), dict):
        metadata.update(row["metadata"])
    task = Task(
        id=f"{data_source}-{split}-{index}",
        messages=tuple(messages),
        ground_truth=answers[0],
        ability=_ability(row.get("ability"), ability_map, where),
        metadata=metadata,
    )
    return task, repaired
