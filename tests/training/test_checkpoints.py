"""Checkpoints are complete or absent; resume skips damaged ones, says so, and leaves the logs as an uninterrupted run's.

Each damage is done to the newest checkpoint of a real 3-step run of the tiny
model; a kill during a checkpoint write is a real SIGKILL of a real training
process, paused inside the save.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentenv.configs import config_from_dict
from agentenv.training.checkpoint import checkpoint_dir, latest_checkpoint, read_state
from agentenv.training.trainer import Trainer

RUN = ["trainer.steps=3", "trainer.keep_checkpoints=3", "trainer.eval_tasks=0"]


@pytest.fixture(scope="module")
def finished_run(fast_module_overrides):
    """A 3-step run with a checkpoint after every step."""
    cfg = config_from_dict({}, fast_module_overrides + RUN)
    Trainer(cfg).train()
    return Path(cfg.trainer.output_dir)


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(run, dst)
    return dst


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))


def _not_rng(p: Path) -> None:
    """A readable file in accelerate's format whose RNG states are garbage (accelerate skips them silently)."""
    torch.save({"step": 3, "random_state": "garbage", "numpy_random_seed": 7, "torch_manual_seed": [1, 2]}, p)


DAMAGE = {
    "truncated safetensors": ("model.safetensors", _truncate),
    "truncated exported model": ("model/model.safetensors", _truncate),
    "garbage optimizer pickle": ("optimizer.bin", _garbage),
    "missing scheduler": ("scheduler.bin", lambda p: p.unlink()),
    "garbage RNG state": ("random_states_0.pkl", _not_rng),
    "garbage trainer state": ("trainer_state.json", lambda p: p.write_text("{not json")),
    "garbage manifest": ("manifest.json", lambda p: p.write_text("[]")),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_damaged_newest_checkpoint(finished_run, fast_module_overrides, tmp_path, caplog, damage):
    out = _copy(finished_run, tmp_path)
    rel, hurt = DAMAGE[damage]
    hurt(checkpoint_dir(out, 3) / rel)
    cfg = config_from_dict({}, fast_module_overrides + RUN + [f"trainer.output_dir={out}"])
    with caplog.at_level(logging.WARNING, logger="agentenv"):
        trainer = Trainer(cfg, resume=True)
    try:
        assert trainer.start_step == 2 and trainer.resumed_from == checkpoint_dir(out, 2)
        assert [p for p, _ in trainer.resume_skipped] == [checkpoint_dir(out, 3)]
        said = caplog.text
        assert "step_000003 cannot be resumed from" in said and "resuming from" in said and "step_000002" in said
        saved = load_file(str(checkpoint_dir(out, 2) / "model.safetensors"))
        live = trainer.unwrapped().state_dict()
        assert all(torch.equal(saved[k], live[k]) for k in saved)
    finally:
        trainer.close()
    # the logs read as if the run had stopped right after checkpoint 2
    assert [json.loads(x)["step"] for x in (out / "batches.jsonl").read_text().splitlines()] == [1, 2]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_garbage_rng_in_a_checkpoint_without_manifest_is_not_silently_ignored(finished_run, fast_module_overrides, tmp_path):
    """A checkpoint written before manifests existed: its files are loaded to check them, the RNG states too."""
    out = _copy(finished_run, tmp_path)
    for step in (2, 3):
        (checkpoint_dir(out, step) / "manifest.json").unlink()
    _not_rng(checkpoint_dir(out, 3) / "random_states_0.pkl")
    cfg = config_from_dict({}, fast_module_overrides + RUN + [f"trainer.output_dir={out}"])
    trainer = Trainer(cfg, resume=True)
    try:
        assert trainer.start_step == 2
        assert "random_states_0.pkl holds no valid RNG states" in trainer.resume_skipped[0][1]
    finally:
        trainer.close()


def test_every_checkpoint_damaged_starts_over_and_says_so(finished_run, fast_module_overrides, tmp_path, caplog):
    out = _copy(finished_run, tmp_path)
    for step in (1, 2, 3):
        _truncate(checkpoint_dir(out, step) / "model.safetensors")
    cfg = config_from_dict({}, fast_module_overrides + RUN + [f"trainer.output_dir={out}"])
    with caplog.at_level(logging.WARNING, logger="agentenv"):
        trainer = Trainer(cfg, resume=True)
    trainer.close()
    assert trainer.start_step == 0 and len(trainer.resume_skipped) == 3
    assert "no intact checkpoint" in caplog.text
    assert (out / "metrics.jsonl").read_text() == "" and (out / "batches.jsonl").read_text() == ""


_PAUSE_IN_SAVE = textwrap.dedent(
    """
    import sys, time
    import agentenv.training.checkpoint as ckpt
    write_state = ckpt.write_state

    def paused(d, state):  # the checkpoint of step 2 is being written: say so, and stop here until killed
        write_state(d, state)
        if state["step"] == 2:
            open(sys.argv[2], "w").close()
            time.sleep(600)

    ckpt.write_state = paused
    from agentenv.cli import app
    app(["train", sys.argv[1]])
    """
)


_ROUNDING_GAP = ("train/logprob_gap_mean", "train/logprob_gap_max", "train/mismatch_kl", "train/is_ratio_max")


def _records(path: Path) -> list[dict]:
    timing = lambda k: k == "time" or k.startswith("time/")  # noqa: E731 - wall times differ between runs
    return [{k: v for k, v in json.loads(x).items() if not timing(k)} for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_then_resume_logs_like_an_uninterrupted_run(finished_run, fast_module_overrides,
                                                                                      tmp_path, kill_at):  # fmt: skip
    out = tmp_path / "killed"
    cfg = config_from_dict({}, fast_module_overrides + RUN + [f"trainer.output_dir={out}"])
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    paused = tmp_path / "paused"
    kill_at([sys.executable, "-c", _PAUSE_IN_SAVE, str(cfg_file), str(paused)], paused.exists, "the save of step 2")
    assert read_state(latest_checkpoint(out))["step"] == 1  # step 2's checkpoint never became one
    assert [json.loads(x)["step"] for x in (out / "batches.jsonl").read_text().splitlines()] == [1, 2]

    trainer = Trainer(cfg, resume=True)
    assert trainer.start_step == 1
    trainer.train()
    # the same records, step by step, as the run that was never killed
    assert _records(out / "batches.jsonl") == _records(finished_run / "batches.jsonl")
    # Metrics to float rounding: the hf policy batches whichever requests are waiting, and a batch's padding
    # moves logits by ~1e-7 when the machine is busy; the same tasks, tokens and rewards must come back.
    # The sampler-trainer gap metrics measure that rounding itself (the same weights on both sides), so they are
    # not equal between runs: each run's must be rounding's size (a weight version apart is orders more).
    got, want = _records(out / "metrics.jsonl"), _records(finished_run / "metrics.jsonl")
    assert [r.keys() for r in got] == [r.keys() for r in want]
    for g, w in zip(got, want, strict=True):
        for r in (g, w):
            gap = {k: r.pop(k) for k in _ROUNDING_GAP}
            assert gap["train/logprob_gap_max"] < 1e-3 and gap["train/mismatch_kl"] < 1e-6, gap
            assert gap["train/is_ratio_max"] < 1.001 and gap["train/logprob_gap_mean"] <= gap["train/logprob_gap_max"], gap
        assert g == pytest.approx(w, rel=1e-4, abs=1e-6), g["step"]
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # no staging left
