"""What `agentenv view` reads: a run folder or a bench folder, tolerant of what is missing or half-written.

A run folder is the trainer's `trainer.output_dir` (`config.json`,
`metrics.jsonl`, `rollouts/`, `eval.json`); a bench folder is a benchmark's
`output_dir` (`bench_config.json`, `results.csv`, `runs/<variant>/seed<seed>/`,
each a run folder). Every reader caps what it loads and returns the problems
it met (a truncated line, a missing file) as sentences beside the data, so the
page can say them; only a folder that is none of these raises `ViewError`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentenv.bench.stats import curve, eval_curve, mean_curve
from agentenv.errors import AgentEnvError
from agentenv.training.rollout_log import ROLLOUT_DIR, STOPPED_FILE

MAX_METRIC_BYTES = 32_000_000  # the tail of metrics.jsonl that is read (a huge run: its last steps)
MAX_POINTS = 2_000  # per curve; longer curves are thinned evenly (first and last kept)
MAX_GROUP_FILE_BYTES = 64_000_000  # a rollout file past this is read up to it, saying so
MAX_GROUPS_PER_PAGE = 50
LIVE_WINDOW_S = 120.0  # a run whose metrics changed this recently, with no eval.json yet, is live
_FILE = re.compile(r"^(train|eval)_(\d+)\.jsonl$")


class ViewError(AgentEnvError):
    """The folder cannot be viewed (missing, or neither a run nor a bench); the message says which and why."""


@dataclass
class Loaded:
    """Data read, and sentences about what could not be (shown in the page)."""

    data: Any
    problems: list[str] = field(default_factory=list)


def read_jsonl(path: Path, max_bytes: int, *, tail: bool = False) -> Loaded:
    """The records of a JSONL file, reading at most `max_bytes` (its head, or with `tail` its end).

    A line that is not a JSON object (a truncated last line of a live run, a
    torn write) is skipped and named in `problems` (with `tail`, its number
    counts from where the read began); a last line cut by `max_bytes` is
    skipped silently, the cut itself being said.
    """
    problems: list[str] = []
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            start = max(0, size - max_bytes) if tail else 0
            f.seek(start)
            raw = f.read(max_bytes)
    except OSError as e:
        return Loaded([], [f"{path.name}: cannot be read ({e.strerror or e})"])
    if len(raw) < size:
        where = "last" if tail else "first"
        problems.append(f"{path.name} is {size / 1e6:.1f} MB: only its {where} {max_bytes / 1e6:.0f} MB are loaded")
    lines = raw.split(b"\n")
    if tail and start > 0:
        lines = lines[1:]  # the first line read is a part of one
    complete = raw.endswith(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        last = i == len(lines) - 1
        try:
            rec = json.loads(line, parse_constant=_nonfinite)
        except ValueError:
            if last and not complete and not tail and len(raw) >= max_bytes:
                continue  # cut by the cap, said above
            problems.append(f"{path.name} line {i + 1}: not valid JSON ({_preview(line)}), skipped"
                            + (" (a line still being written?)" if last and not complete else ""))
            continue
        if not isinstance(rec, dict):
            problems.append(f"{path.name} line {i + 1}: a JSON {type(rec).__name__}, not an object, skipped")
            continue
        records.append(rec)
    return Loaded(records, problems)


def _nonfinite(name: str) -> None:
    """NaN and the infinities (Python's json writes them, e.g. a reward part that was NaN) read as None: JSON has no such number."""
    return None


def _preview(line: bytes, n: int = 40) -> str:
    text = line.decode("utf-8", "replace")
    return repr(text[:n] + ("..." if len(text) > n else ""))


def _read_text(path: Path, problems: list[str], max_bytes: int = 1_000_000) -> str:
    """A small file's text ('' if it cannot be read, said in `problems`); bytes that are not UTF-8 show as U+FFFD."""
    try:
        with path.open("rb") as f:
            return f.read(max_bytes).decode("utf-8", "replace")
    except OSError as e:
        problems.append(f"{path.name}: cannot be read ({e.strerror or e})")
        return ""


def _read_json(path: Path, problems: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        problems.append(f"{path.name}: cannot be read as JSON ({e}), left out")
        return None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _thin(items: list[Any], n: int) -> list[Any]:
    """At most `n` items, evenly spaced, first and last kept."""
    if len(items) <= n:
        return items
    idx = sorted({round(i * (len(items) - 1) / (n - 1)) for i in range(n)})
    return [items[i] for i in idx]


# --------------------------------------------------------------------------- a run
@dataclass
class Run:
    """One run folder."""

    path: Path

    def exists(self) -> bool:
        return (self.path / "metrics.jsonl").exists() or (self.path / "config.json").exists()

    def config(self, problems: list[str]) -> dict[str, Any]:
        cfg = _read_json(self.path / "config.json", problems)
        return cfg if isinstance(cfg, dict) else {}

    def section(self, key: str, problems: list[str]) -> dict[str, Any]:
        """One section of config.json (`{}` when absent or not a mapping)."""
        sec = self.config(problems).get(key)
        return sec if isinstance(sec, dict) else {}

    def metrics(self) -> Loaded:
        """The records of metrics.jsonl (non-finite values as None), the step-wise keys thinned to MAX_POINTS."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return Loaded([], ["no metrics.jsonl yet: the run has not finished its first step (or logging.jsonl=false)"])
        got = read_jsonl(path, MAX_METRIC_BYTES, tail=True)
        records = [r for r in got.data if _is_number(r.get("step"))]
        if len(records) < len(got.data):
            got.problems.append(f"metrics.jsonl: {len(got.data) - len(records)} records without a step, left out")
        odd: set[str] = set()
        for r in records:  # a non-finite value was logged as None: the page draws a gap
            r.pop("nonfinite", None)
            for k, v in list(r.items()):
                if v is not None and not _is_number(v):
                    odd.add(k)
                    del r[k]
        if odd:
            got.problems.append(f"metrics.jsonl: values that are not numbers, left out, under {sorted(odd)[:8]}")
        train = [r for r in records if "rollout/reward" in r]
        other = [r for r in records if "rollout/reward" not in r]
        kept = _thin(train, MAX_POINTS)
        if len(kept) < len(train):
            got.problems.append(f"{len(train)} steps: the curves show {len(kept)} of them, evenly spaced")
        return Loaded(sorted(kept + other, key=lambda r: r["step"]), got.problems)

    def live(self) -> bool:
        """Still being written: no final eval.json and metrics changed in the last LIVE_WINDOW_S seconds."""
        m = self.path / "metrics.jsonl"
        if (self.path / "eval.json").exists() or not m.exists():
            return False
        return time.time() - m.stat().st_mtime < LIVE_WINDOW_S

    def rollout_files(self) -> Loaded:
        """The recorded steps, `[{split, step, bytes}]`, and why there are none (or where the record stops)."""
        d = self.path / ROLLOUT_DIR
        problems: list[str] = []
        files = []
        if d.is_dir():
            for f in d.iterdir():
                m = _FILE.match(f.name)
                try:
                    if m:
                        files.append({"split": m[1], "step": int(m[2]), "bytes": f.stat().st_size})
                except OSError:  # removed since listed: a resumed run dropping its record past the checkpoint
                    continue
        files.sort(key=lambda x: (x["step"], x["split"] == "eval"))  # a step, then the evaluation after it
        if not files:
            problems.append(self._why_no_rollouts(d))
        stopped = d / STOPPED_FILE
        if stopped.exists():
            problems.append(_read_text(stopped, problems).strip())
        return Loaded(files, problems)

    def _why_no_rollouts(self, d: Path) -> str:
        log_cfg = self.section("logging", [])
        if log_cfg.get("save_rollouts") is False:
            return "no saved rollouts: this run was started with logging.save_rollouts=false (metrics only)"
        if "save_rollouts" not in log_cfg and (self.path / "config.json").exists():
            return "no saved rollouts: this run was made before the trainer recorded them (metrics only)"
        if not d.is_dir():
            return "no saved rollouts yet: the run has not recorded a step"
        return "no saved rollouts yet: rollouts/ holds no step (the first is written after step 1)"

    def groups(self, split: str, step: int, offset: int = 0, limit: int = MAX_GROUPS_PER_PAGE) -> Loaded:
        """The groups of one recorded step, `limit` of them from `offset`; `data` is `{groups, total}`."""
        if split not in ("train", "eval"):
            raise ViewError(f"split must be train or eval, got {split!r}")
        path = self.path / ROLLOUT_DIR / f"{split}_{int(step):06d}.jsonl"
        if not path.exists():
            return Loaded({"groups": [], "total": 0}, [f"no recorded {split} step {step} in {self.path}"])
        got = read_jsonl(path, MAX_GROUP_FILE_BYTES)
        limit = max(1, min(int(limit), MAX_GROUPS_PER_PAGE))
        groups = []
        for i, g in enumerate(got.data):
            if not isinstance(g.get("trajectories"), list) or not isinstance(g.get("task"), dict):
                got.problems.append(f"{path.name}: group {i} lacks its task or trajectories, left out")
                continue
            g.setdefault("index", i)
            groups.append(g)
        return Loaded({"groups": groups[offset : offset + limit], "total": len(groups)}, got.problems)

    def task_groups(self, task_id: str, max_files: int = 200) -> Loaded:
        """Every recorded group of `task_id` (the newest `max_files` files searched)."""
        files = self.rollout_files().data[-max_files:]
        out, problems = [], []
        needle = json.dumps(task_id).encode()
        for f in files:
            path = self.path / ROLLOUT_DIR / f"{f['split']}_{f['step']:06d}.jsonl"
            try:
                with path.open("rb") as fh:
                    raw = fh.read(MAX_GROUP_FILE_BYTES)  # the cap, not the whole of a huge file
            except OSError:
                continue
            if needle not in raw:  # most files hold other tasks: skip their parse
                continue
            got = read_jsonl(path, MAX_GROUP_FILE_BYTES)
            problems += got.problems
            out += [g for g in got.data if (g.get("task") or {}).get("id") == task_id]
        return Loaded(out, problems)

    def summary(self) -> dict[str, Any]:
        problems: list[str] = []
        algo = self.section("algorithm", problems).get("name")
        backend = self.section("policy", []).get("backend")  # config.json's problem is said once
        steps = self.section("trainer", []).get("steps")
        return {"algorithm": algo, "backend": backend, "steps": steps, "live": self.live(), "problems": problems,
                "finished": (self.path / "eval.json").exists()}


# --------------------------------------------------------------------------- a folder: one run or a bench
@dataclass
class Folder:
    """What `agentenv view` was pointed at: one run, or a bench's runs by variant.

    Raises:
        ViewError: The folder does not exist, or holds no run.
    """

    root: Path
    kind: str = "run"
    runs: dict[str, Run] = field(default_factory=dict)  # id (relative path) -> run
    variants: dict[str, list[str]] = field(default_factory=dict)  # bench: variant -> its run ids

    @classmethod
    def open(cls, path: str | Path) -> Folder:
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise ViewError(f"{path}: no such folder")
        if not root.is_dir():
            raise ViewError(f"{path}: not a folder (give a run's trainer.output_dir or a bench's output_dir)")
        if (root / "bench_config.json").exists() or (root / "runs").is_dir():
            folder = cls(root, "bench")
            for vdir in sorted(p for p in (root / "runs").glob("*") if p.is_dir() and not p.name.startswith("_")):
                for sdir in sorted(vdir.iterdir(), key=lambda p: (len(p.name), p.name)):
                    run = Run(sdir)
                    if sdir.is_dir() and run.exists():
                        rid = f"{vdir.name}/{sdir.name}"
                        folder.runs[rid] = run
                        folder.variants.setdefault(vdir.name, []).append(rid)
            return folder
        if not Run(root).exists():
            found = [p.name for p in root.iterdir()][:8]
            raise ViewError(
                f"{path}: neither a run (no config.json or metrics.jsonl) nor a bench (no bench_config.json or runs/); "
                f"it holds {found or 'nothing'}. A run writes them when it starts: is this its trainer.output_dir?"
            )
        return cls(root, "run", {".": Run(root)})

    def run(self, rid: str) -> Run:
        try:
            return self.runs[rid]
        except KeyError:
            raise ViewError(f"no run {rid!r} in {self.root}; there are {sorted(self.runs)}") from None

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": str(self.root), "kind": self.kind, "runs": {}, "variants": self.variants,
                               "problems": []}
        for rid, run in self.runs.items():
            out["runs"][rid] = run.summary()
        if self.kind == "bench":
            out["table"] = self.bench_table(out["problems"])
            if not self.runs:
                out["problems"].append("the bench has no finished or running run yet (runs/ is empty)")
        return out

    def bench_table(self, problems: list[str]) -> dict[str, Any] | None:
        """results.csv as `{columns, rows}` (None before the report is written)."""
        path = self.root / "results.csv"
        if not path.exists():
            problems.append("no results.csv yet: the report is written when every run has finished")
            return None
        try:
            rows = list(csv.reader(_read_text(path, problems, MAX_METRIC_BYTES).splitlines()))
        except csv.Error as e:
            problems.append(f"results.csv cannot be read ({e})")
            return None
        return {"columns": rows[0], "rows": rows[1:]} if rows else None

    def bench_curves(self, keys: Sequence[str]) -> Loaded:
        """Per key and variant: steps, mean, min and max over its seeds (at the steps every seed logged)."""
        problems: list[str] = []
        records = {}
        for rid, run in self.runs.items():
            got = run.metrics()
            problems += [f"{rid}: {p}" for p in got.problems]
            records[rid] = [{k: (math.nan if v is None else v) for k, v in r.items()} for r in got.data]
        out: dict[str, dict[str, Any]] = {}
        for key in keys:
            pick = eval_curve if key.startswith("eval/") else curve
            out[key] = {}
            for variant, rids in self.variants.items():
                curves = [c for c in (pick(records[r], key) for r in rids) if c]
                steps, mean, lo, hi = mean_curve(curves)
                out[key][variant] = {"steps": steps, "mean": _finite(mean), "lo": _finite(lo), "hi": _finite(hi),
                                     "seeds": len(curves)}
        return Loaded(out, problems)


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]

