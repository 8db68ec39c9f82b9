"""Training on a CUDA device: FSDP2 under torchrun (NCCL, one GPU) and LoRA, each killed after its checkpoint 1,
resumed and exported, with the same checks as the CPU runs (`test_sharding.check_killed_run`): the rollout policy
holds the gathered trainer weights after the push and its logprobs moved to the trainer's. Run where a GPU is lent."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "case, nproc, extra",
    [
        ("fsdp2", 1, ["trainer.strategy=fsdp2"]),
        ("lora", 1, ["model.lora.r=4", "model.lora.alpha=8"]),
    ],
)
def test_killed_run_on_cuda_pushes_resumes_and_exports(case, nproc, extra, fast_overrides, launch_cmd, kill_at, tmp_path,
                                                       script_module):  # fmt: skip
    sharding = script_module("test_sharding")
    def launch(*args, nproc: int):  # torchrun for fsdp2 even on one GPU: its NCCL process group, as on a GPU node
        return launch_cmd(*args, nproc=nproc, torchrun=case == "fsdp2")

    firsts, resumes = sharding.check_killed_run(case, nproc, extra, fast_overrides, launch, kill_at, tmp_path,
                                                device="cuda")
    # on the GPU: both phases trained there, and the push and the resume moved real weights
    assert len(firsts) == len(resumes) == nproc
    assert all(d.startswith("cuda") for r in firsts + resumes for d in r["devices"].values()), firsts[0]["devices"]
    assert firsts[0]["before"] != firsts[0]["after"] and resumes[0]["start_step"] == 1
