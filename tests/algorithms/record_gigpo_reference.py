"""Record verl-agent's GiGPO advantages on `gigpo_layouts.LAYOUTS` into data/gigpo_verl_agent.json.

    python3 tests/algorithms/record_gigpo_reference.py --core PATH/TO/verl-agent/gigpo/core_gigpo.py --source "..."

verl-agent's code is not part of this repository (its file imports `verl`
for a type; a stub `verl` module with a `DataProto` class stands in here, and
its `compute_step_discounted_returns` gets an object with the two attributes
it reads). The recorded numbers are its outputs, which
`test_gigpo_reference.py` compares agentenv's GiGPO with.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gigpo_layouts import GAMMA, LAYOUTS, MODES, verl_rows  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "gigpo_verl_agent.json"


def load_core(path: str) -> types.ModuleType:
    if "verl" not in sys.modules:
        stub = types.ModuleType("verl")
        stub.DataProto = type("DataProto", (), {})  # type: ignore[attr-defined]
        sys.modules["verl"] = stub
    spec = importlib.util.spec_from_file_location("core_gigpo", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def verl_advantages(core: types.ModuleType, layout: dict, mode: str, w: float) -> list[float]:
    rows = verl_rows(layout)
    batch = types.SimpleNamespace(
        non_tensor_batch={"rewards": rows["rewards"], "traj_uid": rows["traj_index"],
                          "active_masks": torch.ones(len(rows["index"])).numpy()},
        batch={"input_ids": torch.zeros(len(rows["index"]), 1)},
    )  # fmt: skip
    step_rewards = core.compute_step_discounted_returns(batch, GAMMA)
    scores, _ = core.compute_gigpo_outcome_advantage(
        rows["token_level_rewards"], step_rewards, rows["response_mask"], rows["anchor_obs"], rows["index"],
        rows["traj_index"], step_advantage_w=w, mode=mode,
        enable_similarity="similarity" in layout, similarity_thresh=layout.get("similarity", 0.95),
    )  # fmt: skip
    assert torch.all(scores == scores[:, :1])  # one value per row
    return scores[:, 0].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--core", required=True, help="verl-agent's gigpo/core_gigpo.py")
    ap.add_argument("--source", required=True, help="where the file came from (repository, commit)")
    args = ap.parse_args()
    core = load_core(args.core)
    out = {"source": args.source, "function": "gigpo.core_gigpo.compute_gigpo_outcome_advantage", "gamma": GAMMA,
           "advantages": {}}  # fmt: skip
    for name, layout in LAYOUTS.items():
        for mode, (_, w) in MODES.items():
            out["advantages"][f"{name}/{mode}"] = verl_advantages(core, layout, mode.split("_w")[0], w)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}: {len(out['advantages'])} cases")


if __name__ == "__main__":
    main()
