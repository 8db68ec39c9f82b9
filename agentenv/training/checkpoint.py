"""Checkpoints: model, optimizer, scheduler, RNG states and the data cursor.

A checkpoint directory is complete only once its `trainer_state.json` exists
(written last, atomically), so a run killed while saving resumes from the
previous complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under output_dir, or None."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).exists())
    return done[-1] if done else None


def write_state(ckpt: Path, state: dict[str, Any]) -> None:
    tmp = ckpt / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, ckpt / STATE_FILE)


def read_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def prune(output_dir: Path, keep: int) -> None:
    """Remove all but the `keep` newest complete checkpoints, and any incomplete older ones."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return
    dirs = sorted(p for p in root.iterdir() if p.name.startswith("step_"))
    complete = [p for p in dirs if (p / STATE_FILE).exists()]
    keep_set = set(complete[-keep:]) if keep > 0 else set()
    newest = complete[-1] if complete else None
    for p in dirs:
        if p in keep_set:
            continue
        # an incomplete dir newer than the newest complete one may be being written
        if newest is not None and p.name > newest.name and p not in complete:
            continue
        shutil.rmtree(p, ignore_errors=True)
