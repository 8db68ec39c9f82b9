"""Run under torchrun: train a few steps and save each rank's weights before and after."""

import sys
from pathlib import Path

import torch
import yaml

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


if __name__ == "__main__":
    cfg = config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text()))
    trainer = Trainer(cfg)
    before = flat(trainer.unwrapped())
    trainer.train()
    after = flat(trainer.unwrapped())
    rank = trainer.acc.process_index
    torch.save({"before": before, "after": after, "world": trainer.acc.num_processes}, Path(sys.argv[2]) / f"rank{rank}.pt")
