"""Checkpoints: model, optimizer, scheduler, RNG states and the data cursor, complete or absent.

A checkpoint is written into a staging folder (`checkpoints/.tmp-step_000042`),
gets a manifest of every file's size and SHA-256, and is renamed to
`step_000042` only then: a `step_*` folder is always a whole checkpoint, and a
run killed while saving leaves only a staging folder (removed by the next
save). Resume verifies the manifest (and that the RNG states unpickle into RNG
states) and falls back to the newest intact checkpoint, saying which it skipped
and why. The logs are cut back to the checkpoint's step, so a resumed run's
`metrics.jsonl` and `batches.jsonl` read like an uninterrupted run's.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv.errors import InfraError

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from agentenv.training.sharding import Strategy
    from agentenv.types import Tokenizer

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
STAGING_PREFIX = ".tmp-"
RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")
"""What accelerate's `random_states_<rank>.pkl` must hold (it ignores a file that does not, silently)."""


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def staging_dir(output_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` is written before it is renamed into place."""
    return Path(output_dir) / "checkpoints" / f"{STAGING_PREFIX}step_{step:06d}"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Renamed (or pre-manifest) checkpoints, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).exists())


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under output_dir (not verified; see `find_resumable`), or None."""
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def write_state(ckpt: Path, state: dict[str, Any]) -> None:
    (Path(ckpt) / STATE_FILE).write_text(json.dumps(state, indent=1))


def read_state(ckpt: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((Path(ckpt) / STATE_FILE).read_text())
    return state


def begin(output_dir: str | Path, step: int) -> Path:
    """An empty staging folder for `step` (a killed run's leftover is removed)."""
    staging = staging_dir(output_dir, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def finalize(staging: Path, final: Path) -> None:
    """Write the manifest, flush everything to disk, and rename `staging` to `final` (atomic)."""
    files = _files(staging)
    manifest = {"files": {rel: {"bytes": size, "sha256": digest} for rel, size, digest in _hash_all(staging, files)}}
    (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    for rel in [*files, MANIFEST_FILE]:
        _fsync(staging / rel)
    for d in {staging / rel for rel in files} | {staging / MANIFEST_FILE}:
        _fsync_dir(d.parent)
    if final.exists():  # a checkpoint of this step from before a resume that went back past it
        trash = final.with_name(f"{STAGING_PREFIX}old-{final.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(staging, final)
    _fsync_dir(final.parent)


def verify(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from, or None when it is intact.

    Checks every file of the manifest (present, size, SHA-256), that the
    trainer state parses, and that the RNG states unpickle into RNG states.
    A checkpoint from before manifests is checked by loading its files.
    """
    ckpt = Path(ckpt)
    try:
        state = read_state(ckpt)
        if not isinstance(state.get("step"), int) or "stream" not in state:
            return f"{STATE_FILE} lacks the step or the data cursor"
    except (OSError, ValueError) as e:
        return f"{STATE_FILE} is unreadable ({type(e).__name__}: {e})"
    manifest_path = ckpt / MANIFEST_FILE
    if manifest_path.exists():
        reason = _check_manifest(ckpt, manifest_path)
    else:
        reason = _check_loadable(ckpt)
    return reason or _check_rng(ckpt)


def find_resumable(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint, and the newer ones skipped with the reason each is unusable."""
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(complete_checkpoints(output_dir)):
        reason = verify(ckpt)
        if reason is None:
            return ckpt, skipped
        skipped.append((ckpt, reason))
    return None, skipped


def prune(output_dir: str | Path, keep: int) -> None:
    """Keep the `keep` newest checkpoints; remove older ones and staging leftovers of killed saves."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(STAGING_PREFIX):
            shutil.rmtree(p, ignore_errors=True)
    done = complete_checkpoints(output_dir)
    for p in done[: max(0, len(done) - keep)]:
        shutil.rmtree(p, ignore_errors=True)


class Checkpointer:
    """Saves a training loop's checkpoints and resumes from the newest intact one (the RL trainer's and SFT's).

    A checkpoint holds Accelerate's state (model, optimizer, scheduler, RNG
    states), the sharding strategy's files, and the loop's own state in
    `trainer_state.json` (its step, data cursor, ...). Every process calls
    `save` and `resume` alike; the main process writes and renames.

    Args:
        out: The run's folder (`checkpoints/` inside it).
        acc: The `accelerate.Accelerator`.
        strategy: How the model is spread over the processes (it saves and loads its shards).
        model: The prepared model.
        opt: Its prepared optimizer.
        tokenizer: Saved beside the weights (an exported checkpoint is a transformers folder).
        keep: How many recent checkpoints to keep.
        say: Where resume's warnings go (a line each).
    """

    def __init__(self, out: Path, acc: Accelerator, strategy: Strategy, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 tokenizer: Tokenizer,
                 keep: int, say: Callable[[str], None] = log.warning):  # fmt: skip
        self.out = Path(out)
        self.acc = acc
        self.strategy = strategy
        self.model = model
        self.opt = opt
        self.tokenizer = tokenizer
        self.keep = keep
        self.say = say

    def save(self, step: int, state: Callable[[], dict[str, Any]]) -> Path:
        """Write checkpoint `step` into a staging folder, then rename it into place (complete or absent).

        `state()`, the loop's own state, is asked for once every process's files are written.
        """
        final = checkpoint_dir(self.out, step)
        staging = staging_dir(self.out, step)
        if self.acc.is_main_process:
            begin(self.out, step)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(staging))
        self.strategy.save(self.model, self.opt, staging, self.tokenizer)
        self.acc.wait_for_everyone()  # every rank's RNG state and shards are written
        loop_state = state()
        if self.acc.is_main_process:
            write_state(staging, {"step": step, **loop_state, "time": time.time()})
            finalize(staging, final)
            prune(self.out, self.keep)
        self.acc.wait_for_everyone()
        return final

    def resume(
        self, load_state: Callable[[dict[str, Any]], None]
    ) -> tuple[Path | None, dict[str, Any], list[tuple[Path, str]]]:
        """Load the newest intact checkpoint (saying which damaged ones were skipped); cut the logs back to it.

        `load_state(state)` loads the loop's own state from the checkpoint's
        `trainer_state.json` (what `save` was given), before the logs are cut.

        Returns:
            The checkpoint (None: none is intact, the run starts at step 0), its
            `trainer_state.json` ({} without one), and the newer checkpoints skipped with why.

        Raises:
            InfraError: The checkpoint passed verification but did not load.
        """
        chosen: Path | None = None
        skipped: list[tuple[Path, str]] = []
        if self.acc.is_main_process:
            chosen, skipped = find_resumable(self.out)
            for path, why in skipped:
                self.say(f"checkpoint {path} cannot be resumed from: {why}")
            if chosen is not None and skipped:
                self.say(f"resuming from the newest intact checkpoint, {chosen}")
            elif chosen is None:
                self.say(f"no intact checkpoint in {self.out / 'checkpoints'}: starting at step 0")
        chosen = _broadcast_path(chosen)
        state: dict[str, Any] = {}
        if chosen is not None:
            try:
                self.acc.load_state(str(chosen))
                self.strategy.load(self.model, self.opt, chosen)
            except Exception as e:  # verified, yet unloadable: never continue half-loaded
                raise InfraError(
                    f"checkpoint {chosen} passed verification but did not load ({type(e).__name__}: {e}); "
                    "move it aside to resume from an older one"
                ) from e
            state = read_state(chosen)
            load_state(state)
        if self.acc.is_main_process:
            truncate_logs(self.out, int(state.get("step", 0)))
        return chosen, state, skipped


def _broadcast_path(path: Path | None) -> Path | None:
    """The main process's choice, on every rank (ranks must resume from the same checkpoint)."""
    from accelerate.utils import broadcast_object_list

    box = [str(path) if path is not None else None]
    broadcast_object_list(box)
    return Path(box[0]) if box[0] is not None else None


LOGS = ("metrics.jsonl", "batches.jsonl")


def truncate_logs(output_dir: str | Path, step: int, names: tuple[str, ...] = LOGS) -> None:
    """Cut JSONL logs back to what an uninterrupted run had written when it saved checkpoint `step`.

    Kept: records of steps before `step`, and the first record of `step`
    itself (the step's own, logged before its checkpoint); an eval record of
    the same step and every later step go, as does a line a kill cut short.
    With `step` 0 nothing is kept: the resumed run starts over, its initial
    evaluation included. Each file is replaced atomically.
    """
    for name in names:
        path = Path(output_dir) / name
        if not path.exists():
            continue
        kept, seen = [], False
        for line in path.read_text().splitlines():
            try:
                rec_step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue  # torn by a kill
            if step > 0 and (rec_step < step or (rec_step == step and not seen)):
                kept.append(line)
                seen = seen or rec_step == step
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)


# --------------------------------------------------------------------------- helpers
def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _hash_all(root: Path, files: list[str]) -> list[tuple[str, int, str]]:
    # hashlib releases the GIL on large buffers: files hash in parallel
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda rel: _sha256(root / rel), files))
    return [(rel, (root / rel).stat().st_size, d) for rel, d in zip(files, digests)]


def _check_manifest(ckpt: Path, manifest_path: Path) -> str | None:
    try:
        entries = json.loads(manifest_path.read_text())["files"]
        expected = {rel: (int(e["bytes"]), str(e["sha256"])) for rel, e in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST_FILE} is unreadable ({type(e).__name__}: {e})"
    missing = [rel for rel in expected if not (ckpt / rel).is_file()]
    if missing:
        return f"{missing[0]} is missing"
    for rel, (size, _) in expected.items():
        actual = (ckpt / rel).stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, the manifest says {size} (truncated or overwritten)"
    for rel, _size, digest in _hash_all(ckpt, sorted(expected)):
        if digest != expected[rel][1]:
            return f"{rel} does not match its SHA-256 in the manifest (corrupt)"
    return None


def _check_loadable(ckpt: Path) -> str | None:
    """A checkpoint without a manifest: every weight and state file must load."""
    import torch
    from safetensors import safe_open

    for path in sorted(ckpt.rglob("*")):
        rel = path.relative_to(ckpt)
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as f:
                    for key in f.keys():
                        f.get_slice(key)
            elif path.suffix in (".bin", ".pkl", ".pt"):
                torch.load(path, map_location="cpu", weights_only=False)
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as e:  # noqa: BLE001 - safetensors, pickle and torch raise many kinds
            return f"{rel} does not load ({type(e).__name__}: {str(e)[:200]})"
    return None


def _check_rng(ckpt: Path) -> str | None:
    import torch

    for path in sorted(ckpt.glob("random_states_*.pkl")):
        try:
            states = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt checkpoint: say which file
            return f"{path.name} does not unpickle ({type(e).__name__}: {str(e)[:200]})"
        ok = (
            isinstance(states, dict)
            and isinstance(states.get("random_state"), tuple)
            and isinstance(states.get("numpy_random_seed"), tuple)
            and isinstance(states.get("torch_manual_seed"), torch.Tensor)
            and states["torch_manual_seed"].dtype == torch.uint8
        )
        if not ok:
            return f"{path.name} holds no valid RNG states {list(RNG_KEYS)} (accelerate would skip them silently)"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:  # some filesystems cannot fsync a directory
        pass
