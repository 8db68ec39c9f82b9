"""Sharded training (FSDP2) and LoRA on two CPU processes (torchrun, gloo) and on one.

Each case trains the tiny model, is killed with SIGKILL after its checkpoint 1,
resumes, and is exported; `shard_run.py` records from inside the run what the
test checks: the rollout policy holds the gathered (LoRA: merged) trainer
weights after the step and its logprobs moved to the trainer's; the resumed run
holds the checkpoint's weights and optimizer state and draws the same next
batch; `agentenv export` of the last checkpoint scores like the trainer.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from agentenv.configs import config_from_dict
from agentenv.training.checkpoint import find_resumable, latest_checkpoint
from agentenv.training.data import TaskStream
from agentenv.training.scoring import sequence_logprobs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

CASES = {
    "fsdp2": (2, ["trainer.strategy=fsdp2"]),
    "fsdp2-lora": (2, ["trainer.strategy=fsdp2", "model.lora.r=4", "model.lora.alpha=8"]),
    "lora": (1, ["model.lora.r=4", "model.lora.alpha=8"]),
}


def run_killed_then_resumed(nproc: int, cfg_file: Path, out: Path, launch_cmd, kill_at) -> None:
    def launch(phase: str) -> list[str]:
        return launch_cmd(HERE / "shard_run.py", str(cfg_file), str(out), phase, nproc=nproc)

    kill_at(launch("first"), (out / "killme").exists, "its checkpoint 1")  # shard_run.py waits there, mid-run
    resumed = subprocess.run(launch("resume"), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_killed_sharded_run_pushes_resumes_and_exports(case, fast_overrides, launch_cmd, kill_at, tmp_path):
    nproc, extra = CASES[case]
    check_killed_run(case, nproc, extra, fast_overrides, launch_cmd, kill_at, tmp_path)


def check_killed_run(
    case: str, nproc: int, extra: list[str], fast_overrides, launch_cmd, kill_at, tmp_path: Path, device: str = "cpu"
) -> tuple[list[dict], list[dict]]:
    """Train `nproc` processes with `extra` overrides on `device` (its type), SIGKILL after checkpoint 1, resume,
    export; check it all (also run on a CUDA device by tests/training/test_gpu_training.py)."""
    # Groups of 4: a group of 2 often scores the same twice (no gradient), and the weights must move.
    cfg = config_from_dict(
        {}, fast_overrides + extra + ["trainer.steps=2", "trainer.eval_tasks=1", "algorithm.group_size=4"]
    )
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.to_dict()))
    run = Path(cfg.trainer.output_dir)
    run_killed_then_resumed(nproc, cfg_file, tmp_path, launch_cmd, kill_at)

    firsts = [torch.load(tmp_path / f"first.rank{r}.pt", weights_only=False) for r in range(nproc)]
    resumes = [torch.load(tmp_path / f"resume.rank{r}.pt", weights_only=False) for r in range(nproc)]
    first = firsts[0]
    for rec in firsts + resumes:  # the trainer and its rollout policy ran where asked
        assert {k: v.split(":")[0] for k, v in rec["devices"].items()} == {"trainer": device, "policy": device}
    for rec in firsts:
        # after step 1's push, every rank's rollout policy holds exactly the gathered trainer weights
        assert rec["weights"] and all(torch.equal(rec["policy"][n], t) for n, t in rec["weights"].items())
        assert all(torch.equal(rec["weights"][n], t) for n, t in first["weights"].items()), "ranks disagree"
        # the policy's logprobs moved with the step, to what the trainer computes
        assert rec["before"][0] != rec["after"][0] or rec["before"][1] != rec["after"][1]
        torch.testing.assert_close(torch.tensor(rec["after"][1]), rec["trainer_lp"], atol=2e-4, rtol=0)
    base = _base_weights(cfg)
    assert any(not torch.equal(base[n], t) for n, t in first["weights"].items()), "step 1 changed no weight"

    # the checkpoint the kill left is sharded (or an adapter) and the resumed run holds what the run had then
    ckpt1 = run / "checkpoints" / "step_000001"
    layout = {p.name for p in ckpt1.iterdir()}
    if "fsdp2" in case:
        assert "sharded" in layout and "model" not in layout
        assert len(list((ckpt1 / "sharded").glob("*.distcp"))) == nproc
    if "lora" in case:
        assert "adapter" in layout
    stream = TaskStream(cfg.env.tasks.load().train, seed=cfg.trainer.seed)
    stream.next_batch(cfg.trainer.tasks_per_step)
    expected = [t.id for t in stream.peek(cfg.trainer.tasks_per_step)]
    for rec in resumes:
        assert rec["start_step"] == 1
        assert rec["next_batch"] == first["next_batch"] == expected
        assert rec["weights"].keys() == first["weights"].keys()
        assert all(torch.equal(rec["weights"][n], t) for n, t in first["weights"].items())
        assert rec["optimizer"].keys() == first["optimizer"].keys() and rec["optimizer"]
        for name, state in first["optimizer"].items():
            assert all(torch.equal(rec["optimizer"][name][k], v) for k, v in state.items()), name
    assert latest_checkpoint(run).name == "step_000002"

    # export of the run's last checkpoint: a transformers folder that scores like the trainer did
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentenv.training.export import export

    exported = export(run, tmp_path / "exported")
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert AutoTokenizer.from_pretrained(exported).vocab_size == AutoTokenizer.from_pretrained(cfg_model(cfg)).vocab_size
    probe = resumes[0]["probe"]
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, torch.tensor([probe]))
    torch.testing.assert_close(lp[0], resumes[0]["final_lp"], atol=2e-4, rtol=0)

    # a damaged shard is caught by the checkpoint's manifest: resume falls back to the older checkpoint
    if "fsdp2" in case:
        shard = sorted((run / "checkpoints" / "step_000002" / "sharded").glob("*.distcp"))[-1]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        chosen, skipped = find_resumable(run)
        assert chosen == ckpt1 and "does not match its SHA-256" in skipped[0][1]
    return firsts, resumes


def cfg_model(cfg) -> str:
    from agentenv.policies.models import resolve_model_path

    return resolve_model_path(cfg.model.path)


def _base_weights(cfg) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(cfg_model(cfg)) / "model.safetensors"))
