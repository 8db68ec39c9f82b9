"""Reading a JSONL passage corpus (`id`, `title`, `text` per line)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from agentenv.errors import ToolError
from agentenv.tools.search.format import Passage

HOW_TO_MAKE = (
    "A corpus is a JSONL file with one passage per line: "
    '{"id": "...", "title": "...", "text": "..."}. '
    "The toy two-hop tasks write one with `build_toy_suite(ToyConfig(...)).write_corpus(path)`."
)


@dataclass(frozen=True)
class Corpus:
    """Passages of one corpus file and the sha256 of its bytes (the index's cache key)."""

    path: Path
    passages: list[Passage]
    sha256: str

    def __len__(self) -> int:
        return len(self.passages)


def load_corpus(path: str | Path) -> Corpus:
    """Read a JSONL corpus.

    Each line needs `text` (or FlashRAG/ARPO-style `contents`, whose first line is
    the title); `title` defaults to "" and `id` to the line number.

    Raises:
        ToolError: The file is missing, unreadable, empty, or a line is not a passage.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ToolError(f"search corpus not found: {str(path)!r}. {HOW_TO_MAKE}")
    digest = hashlib.sha256()
    passages: list[Passage] = []
    try:
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, start=1):
                digest.update(raw)
                if not raw.strip():
                    continue
                passages.append(_parse_line(raw, path, lineno))
    except OSError as e:
        raise ToolError(f"cannot read search corpus {str(path)!r}: {e}") from e
    if not passages:
        raise ToolError(f"search corpus {str(path)!r} has no passages. {HOW_TO_MAKE}")
    return Corpus(path=path, passages=passages, sha256=digest.hexdigest())


def _parse_line(raw: bytes, path: Path, lineno: int) -> Passage:
    try:
        rec = json.loads(raw)
    except ValueError as e:
        raise ToolError(f"{path}:{lineno}: not valid JSON ({e}). {HOW_TO_MAKE}") from e
    if not isinstance(rec, dict):
        raise ToolError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}. {HOW_TO_MAKE}")
    title = rec.get("title")
    text = rec.get("text")
    if text is None and isinstance(rec.get("contents"), str):
        head, _, body = rec["contents"].partition("\n")
        title = head.strip().strip('"') if title is None else title
        text = body
    if not isinstance(text, str):
        raise ToolError(f"{path}:{lineno}: passage has no string 'text' field. {HOW_TO_MAKE}")
    return Passage(title=str(title or ""), text=text, id=str(rec.get("id", lineno)))
