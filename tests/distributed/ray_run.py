"""Run under torchrun: one training step with `rollout.placement=ray` on workers another process started.

argv: the run config (yaml), the folder for each rank's report.
"""

import json
import sys
from pathlib import Path

import yaml

from agentenv.configs import config_from_dict
from agentenv.training.trainer import Trainer

if __name__ == "__main__":
    cfg = config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text()))
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train_step(0)
        policy = trainer.rt.policy
        report = {
            "rank": trainer.acc.process_index,
            "world": trainer.acc.num_processes,
            "lead": policy.lead,
            "owner": policy.owner,
            "weight_version": policy.weight_version,
            "workers": sorted((i["pid"], i["version"]) for i in policy.worker_info()),
            "tool_owner": trainer.rt.tools["python"].owner,
            "failed": metrics["rollout/failed"],
            "trajectories": metrics.get("rollout/trajectories", -1),
        }
    finally:
        trainer.close()
    (Path(sys.argv[2]) / f"rank{report['rank']}.json").write_text(json.dumps(report))
