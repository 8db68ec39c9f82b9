"""A bounded record of sampled groups in the run folder, for `agentenv view`.

`rollouts/train_<step>.jsonl` holds some groups of a recorded training step
and `rollouts/eval_<step>.jsonl` some groups of an evaluation, one group per
line: the task, and per trajectory its segments (token ids, text; for policy
segments each token's text, sampler logprob, entropy, weight version, the
trainer's advantage and loss mask), tool calls with their error kinds, the
reward and its parts, and for tree samplers its place in the tree (parent,
branch token, and the probe whose entropy made the parent branch there).

The record is kept small by `logging.rollouts_every`, `rollouts_groups`,
`rollouts_eval_groups` and a size cap `rollouts_max_mb`; where it stops, the
file `rollouts/STOPPED` says why. Groups are turned into plain lists on the
trainer's thread (a copy: the trainer may reuse its tensors), then encoded,
decoded and written by one background thread, so a step waits for neither.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv.configs import LoggingConfig
from agentenv.types import Group, Tokenizer, Trajectory

if TYPE_CHECKING:  # pragma: no cover - torch is loaded by the trainer; `agentenv view` reads files without it
    import torch

log = logging.getLogger(__name__)

ROLLOUT_DIR = "rollouts"
STOPPED_FILE = "STOPPED"
FORMAT_VERSION = 1


def _num(x: float, digits: int = 4) -> float | None:
    """A float JSON can hold (rounded to keep the record small); None for NaN and infinities."""
    return round(float(x), digits) if math.isfinite(x) else None


def _task_record(group: Group) -> dict[str, Any]:
    task = group.task
    return {
        "id": task.id,
        "kind": str(task.metadata.get("kind", task.ability)),
        "question": task.question,
        "ground_truth": task.ground_truth,
    }


def _tree_info(traj: Trajectory, by_uid: dict[str, Trajectory]) -> dict[str, Any] | None:
    """A tree sampler's place of `traj`: role, path, H_initial, its probes, and the parent's probe it branched at."""
    arpo = traj.info.get("arpo")
    if arpo is None and traj.parent_uid is None:
        return None
    tree = dict(arpo or {})
    parent = by_uid.get(traj.parent_uid or "")
    if parent is not None and traj.branch_token is not None:
        probes = (parent.info.get("arpo") or {}).get("probes", [])
        tree["trigger"] = next((p for p in probes if p.get("token") == traj.branch_token), None)
    return tree


def _calls(traj: Trajectory) -> list[dict[str, Any]]:
    """The env's per-call record (`info["calls"]`), or else one entry per tool segment (an outside agent's)."""
    calls = traj.info.get("calls")
    if calls is not None:
        return [dict(c) for c in calls]
    return [{"segment": i, "tool": None, "ok": None, "kind": None} for i, s in enumerate(traj.segments) if s.source == "tool"]


def snapshot_group(
    group: Group, advantages: Sequence[torch.Tensor | None] | None = None, masks: Sequence[torch.Tensor | None] | None = None
) -> dict[str, Any]:
    """A group as plain data (no text yet): what the writer thread encodes.

    Args:
        group: The group.
        advantages: Per trajectory, its per-token advantages, (len(traj),), or None.
        masks: Per trajectory, the trainer's loss mask, (len(traj),), or None.
    """
    by_uid = {t.uid: t for t in group}
    trajs = []
    for i, t in enumerate(group):
        adv = advantages[i] if advantages is not None else None
        mask = masks[i] if masks is not None else None
        trajs.append(
            {
                "uid": t.uid,
                "parent": t.parent_uid,
                "branch_token": t.branch_token,
                "segments": [
                    (s.source, list(s.token_ids), s.logprobs and list(s.logprobs), s.entropies and list(s.entropies),
                     s.versions and list(s.versions))
                    for s in t.segments
                ],
                "adv": adv.tolist() if adv is not None else None,
                "mask": mask.tolist() if mask is not None else None,
                "reward": t.reward,
                "reward_parts": dict(t.info.get("reward", {})),
                "correct": t.correct,
                "finish_reason": t.finish_reason,
                "failed": t.failed,
                "error": t.error,
                "tool_calls": dict(t.tool_calls),
                "tool_errors": {k: dict(v) for k, v in t.tool_errors.items()},
                "calls": _calls(t),
                "tree": _tree_info(t, by_uid),
                "gen_time_s": t.gen_time_s,
                "tool_time_s": t.tool_time_s,
            }
        )
    info = {k: v for k, v in group.info.items() if k != "decisions" and isinstance(v, (int, float, str, bool))}
    return {"task": _task_record(group), "info": info, "trajectories": trajs}


def encode_group(snap: dict[str, Any], tokenizer: Tokenizer, pieces: dict[int, str] | None = None) -> dict[str, Any]:
    """A snapshot with its text decoded: the record one JSONL line holds (`pieces`: a cache of each id's text)."""
    pieces = {} if pieces is None else pieces

    def piece(i: int) -> str:
        text = pieces.get(i)
        if text is None:
            text = pieces[i] = tokenizer.decode([i], skip_special_tokens=False)
        return text

    out = dict(snap)
    trajs = []
    for t in snap["trajectories"]:
        t = dict(t)
        adv, mask = t.pop("adv"), t.pop("mask")
        segs, pos = [], 0
        for source, ids, lps, ents, vers in t["segments"]:
            seg: dict[str, Any] = {"source": source, "ids": ids}
            if source == "policy":
                seg["pieces"] = [piece(i) for i in ids]
                seg["text"] = "".join(seg["pieces"])
                seg["logprobs"] = [_num(x) for x in lps or []]
                seg["entropies"] = [_num(x) for x in ents or []]
                if vers is not None:
                    seg["versions"] = vers
                if adv is not None:
                    seg["adv"] = [_num(x) for x in adv[pos : pos + len(ids)]]
                if mask is not None:
                    seg["mask"] = [int(x) for x in mask[pos : pos + len(ids)]]
            else:
                seg["text"] = tokenizer.decode(ids, skip_special_tokens=False)
            segs.append(seg)
            pos += len(ids)
        t["segments"] = segs
        policy_adv = [a for s in segs for a, m in zip(s.get("adv", []), s.get("mask", [])) if m and a is not None]
        t["advantage"] = _num(sum(policy_adv) / len(policy_adv)) if policy_adv else None
        t["reward"] = _num(t["reward"])
        trajs.append(t)
    out["trajectories"] = trajs
    out["version"] = FORMAT_VERSION
    return out


def _per_token(batch_rows: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """Rows of a (B, T) per-predicted-token tensor as per-token tensors (len(traj),): token j is column j - 1."""
    import torch

    out = []
    for row, n in zip(batch_rows, lengths):
        full = torch.zeros(n, dtype=row.dtype)
        k = min(n - 1, row.shape[0])
        if k > 0:
            full[1 : k + 1] = row[:k]
        out.append(full)
    return out


class RolloutLog:
    """Writes the record; one per run, on the main process.

    Args:
        out_dir: The run folder (`rollouts/` goes inside).
        cfg: The run's logging section.
        tokenizer: Decodes the token ids into text (on the writer thread).
        resume_step: On resume, the step resumed from: the record past it is dropped. A fresh run (None)
            drops an older run's record in the folder: its steps would mix with this run's, and its `STOPPED`
            would stop this one.
    """

    def __init__(self, out_dir: Path, cfg: LoggingConfig, tokenizer: Tokenizer, resume_step: int | None = None):
        dropped = truncate_rollouts(out_dir, -1 if resume_step is None else resume_step)
        if dropped and resume_step is None:
            log.warning("%s: dropped an earlier run's rollout record (%d files): this run starts it anew",
                        Path(out_dir) / ROLLOUT_DIR, dropped)  # fmt: skip
        self.dir = Path(out_dir) / ROLLOUT_DIR
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.cap = int(cfg.rollouts_max_mb * 1e6)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.written = sum(f.stat().st_size for f in self.dir.glob("*.jsonl"))
        self.stopped = (self.dir / STOPPED_FILE).exists()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentenv-rollout-log")
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self._pieces: dict[int, str] = {}  # token id -> its text, decoded once

    def train_step(self, step: int, groups: Sequence[Group], trajs: Sequence[Trajectory], batch: Any) -> None:
        """Record step `step`'s first groups, with the trainer's per-token advantages and loss mask.

        Args:
            step: The step's number as logged (1-based).
            groups: The step's groups on this process.
            trajs: Their trajectories in batch order (row i of `batch` is `trajs[i]`).
            batch: The step's `TrainBatch`, its advantages final (after `Algorithm.finalize`).
        """
        if self.stopped or step % self.cfg.rollouts_every:
            return
        try:
            keep = groups if self.cfg.rollouts_groups == 0 else groups[: self.cfg.rollouts_groups]
            n = sum(len(g) for g in keep)  # the kept groups are the batch's first rows
            lengths = [len(t) for t in trajs[:n]]
            advs = _per_token(batch.advantages[:n].detach().cpu(), lengths)
            masks = _per_token(batch.loss_mask[:n].detach().cpu(), lengths)
            snaps, row = [], 0
            for g in keep:
                snaps.append(snapshot_group(g, advs[row : row + len(g)], masks[row : row + len(g)]))
                row += len(g)
        except Exception:  # noqa: BLE001 - the record is for looking at; it never stops training
            log.exception("could not record the rollouts of train step %d", step)
            return
        self._submit(f"train_{step:06d}.jsonl", step, "train", snaps)

    def evaluation(self, step: int, groups: Sequence[Group]) -> None:
        """Record the first groups of the evaluation after step `step` (0: before training)."""
        if self.stopped:
            return
        keep = groups if self.cfg.rollouts_eval_groups == 0 else groups[: self.cfg.rollouts_eval_groups]
        try:
            snaps = [snapshot_group(g) for g in keep]
        except Exception:  # noqa: BLE001 - as in train_step
            log.exception("could not record the rollouts of the evaluation at step %d", step)
            return
        self._submit(f"eval_{step:06d}.jsonl", step, "eval", snaps)

    def _submit(self, name: str, step: int, split: str, snaps: list[dict[str, Any]]) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._write, name, step, split, snaps))

    def _write(self, name: str, step: int, split: str, snaps: list[dict[str, Any]]) -> None:
        try:
            lines = []
            for i, snap in enumerate(snaps):
                rec = encode_group(snap, self.tokenizer, self._pieces)
                rec.update(step=step, split=split, index=i)
                lines.append(json.dumps(rec, separators=(",", ":"), default=str) + "\n")
            data = "".join(lines).encode()
            with self._lock:
                if self.stopped:
                    return
                if self.written + len(data) > self.cap:
                    self.stopped = True
                    (self.dir / STOPPED_FILE).write_text(
                        f"the record stops before {split} step {step}: rollouts/ reached logging.rollouts_max_mb="
                        f"{self.cfg.rollouts_max_mb:g} ({self.written / 1e6:.1f} MB written)\n"
                    )
                    return
                tmp = self.dir / f".{name}.tmp"
                tmp.write_bytes(data)
                tmp.replace(self.dir / name)  # whole or absent: a live viewer never reads half a file
                self.written += len(data)
        except Exception:  # noqa: BLE001 - the record is for looking at; it never stops training
            log.exception("could not record the rollouts of %s step %d", split, step)

    def flush(self) -> None:
        """Wait until everything submitted is written."""
        for f in self._pending:
            f.result()
        self._pending = []

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)


def truncate_rollouts(out_dir: Path, step: int) -> int:
    """Drop the record of training steps after `step` (a resumed run writes them again), files a crash left half
    written, and `STOPPED` (what the cut freed may hold the steps again; the cap says anew where it stops).

    Returns:
        How many step files were dropped.
    """
    d = Path(out_dir) / ROLLOUT_DIR
    dropped = 0
    for f in d.glob("*.jsonl"):
        kind, _, num = f.stem.partition("_")
        if num.isdigit() and int(num) > step and kind in ("train", "eval"):
            f.unlink()
            dropped += 1
    for f in [*d.glob(".*.jsonl.tmp"), d / STOPPED_FILE]:
        f.unlink(missing_ok=True)
    return dropped
