"""The rollout record (`logging.save_rollouts`) on hand-built groups: what a line holds, how it is bounded
(every N steps, K groups, the size cap), the trainer's per-token advantages in place, a resume's cut."""

from __future__ import annotations

import json

import pytest
import torch

from agentenv.configs import LoggingConfig
from agentenv.errors import ConfigError
from agentenv.tasks.task import Task
from agentenv.training.batching import collate
from agentenv.training.rollout_log import RolloutLog
from agentenv.types import Group, Segment, Trajectory
from agentenv.view.loader import Folder


class CharTokenizer:
    """Token id i is the letter chr(97 + i % 26)."""

    eos_token_id = 0
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def _group(n: int = 0) -> Group:
    task = Task(f"t{n}", ({"role": "user", "content": f"q{n}"},), "a", metadata={"kind": "twohop"})
    probe = {"path": "i0", "tool_result": 1, "token": 5, "h_initial": 0.3, "h_t": 1.1, "delta_h": 0.08, "branch": True,
             "forks_wanted": 1, "forks": 1}  # fmt: skip
    root = Trajectory(
        task.id,
        [Segment("prompt", [1, 2]), Segment("policy", [3, 4], [-0.5, float("-inf")], [0.2, 1.0], [7, 7]),
         Segment("tool", [5]), Segment("policy", [6], [-0.1], [0.4], [8])],
        reward=1.0, finish_reason="answer", tool_calls={"search": 1}, uid="r",
        info={"reward": {"score": 1.0, "correct": True}, "calls": [{"segment": 2, "tool": "search", "ok": True, "kind": None}],
              "arpo": {"role": "initial", "path": "i0", "h_initial": 0.3, "probes": [probe]}},
    )  # fmt: skip
    branch = Trajectory(
        task.id,
        [Segment("prompt", [1, 2]), Segment("policy", [3, 4], [-0.5, -0.2], [0.2, 1.0]), Segment("tool", [5]),
         Segment("policy", [9, 10], [-1.0, -2.0], [0.9, 0.8])],
        reward=-1.0, finish_reason="answer", tool_calls={"search": 1}, tool_errors={"search": {"timeout": 1}},
        uid="b", parent_uid="r", branch_token=5,
        info={"calls": [{"segment": 2, "tool": "search", "ok": False, "kind": "timeout"}],
              "arpo": {"role": "branch", "path": "i0.t1.b0", "h_initial": 0.3, "probes": []}},
    )  # fmt: skip
    return Group(task, [root, branch], info={"branch_points": 1, "decisions": [probe]})


def _step(log: RolloutLog, step: int, groups: list[Group]) -> None:
    trajs = [t for g in groups for t in g]
    advs = [torch.arange(len(t), dtype=torch.float32) for t in trajs]  # per token (as Algorithm.advantages): its index
    log.train_step(step, groups, trajs, collate(trajs, advs, pad_id=0))


def test_a_recorded_step_holds_text_masks_tokens_and_the_tree(tmp_path):
    log = RolloutLog(tmp_path, LoggingConfig(rollouts_groups=1), CharTokenizer())
    _step(log, 1, [_group(0), _group(1)])
    log.close()
    lines = (tmp_path / "rollouts" / "train_000001.jsonl").read_text().splitlines()
    assert len(lines) == 1  # rollouts_groups=1 of 2
    g = json.loads(lines[0])
    assert g["task"] == {"id": "t0", "kind": "twohop", "question": "q0", "ground_truth": "a"}
    assert "decisions" not in g["info"] and g["step"] == 1 and g["split"] == "train"
    root, branch = g["trajectories"]
    pol = root["segments"][1]
    assert pol["pieces"] == ["d", "e"] and pol["text"] == "de" and pol["ids"] == [3, 4]
    assert pol["logprobs"] == [-0.5, None]  # -inf is no JSON number
    assert pol["entropies"] == [0.2, 1.0] and pol["versions"] == [7, 7]
    assert pol["adv"] == [2.0, 3.0] and pol["mask"] == [1, 1]  # the trainer's, moved back onto the tokens
    assert root["segments"][0] == {"source": "prompt", "ids": [1, 2], "text": "bc"}
    assert root["advantage"] == pytest.approx((2 + 3 + 5) / 3, abs=1e-4)  # over its policy tokens
    assert root["reward"] == 1.0 and root["reward_parts"]["correct"] is True
    assert branch["parent"] == "r" and branch["branch_token"] == 5
    assert branch["tree"]["trigger"]["h_t"] == 1.1  # the parent's probe that made it branch
    assert branch["calls"] == [{"segment": 2, "tool": "search", "ok": False, "kind": "timeout"}]
    assert branch["tool_errors"] == {"search": {"timeout": 1}} and "versions" not in branch["segments"][1]


def test_every_n_steps_and_the_size_cap_bound_the_record(tmp_path):
    with pytest.raises(ConfigError, match="logging.rollouts_every"):
        LoggingConfig(rollouts_every=0)
    log = RolloutLog(tmp_path, LoggingConfig(rollouts_every=2, rollouts_max_mb=0.004), CharTokenizer())
    for step in range(1, 9):
        _step(log, step, [_group(0), _group(1)])
    log.evaluation(8, [_group(2)])
    log.close()
    files = sorted(p.name for p in (tmp_path / "rollouts").glob("*.jsonl"))
    assert files and all(int(f[6:12]) % 2 == 0 for f in files)  # every 2nd step only
    assert len(files) < 4  # the cap stopped it
    assert sum(p.stat().st_size for p in (tmp_path / "rollouts").glob("*.jsonl")) <= 4_000
    (tmp_path / "metrics.jsonl").write_text("")
    problems = Folder.open(tmp_path).run(".").rollout_files().problems  # the viewer says where the record stops
    assert any("reached logging.rollouts_max_mb=0.004" in p for p in problems), problems


def test_a_resume_drops_the_record_past_its_checkpoint(tmp_path):
    log = RolloutLog(tmp_path, LoggingConfig(), CharTokenizer())
    for step in (1, 2, 3):
        _step(log, step, [_group(0)])
    log.evaluation(0, [_group(1)])
    log.evaluation(3, [_group(1)])
    log.close()
    RolloutLog(tmp_path, LoggingConfig(), CharTokenizer(), resume_step=2).close()
    assert sorted(p.name for p in (tmp_path / "rollouts").glob("*.jsonl")) == [
        "eval_000000.jsonl", "train_000001.jsonl", "train_000002.jsonl"]


def test_a_resume_lifts_the_cap_stop_and_drops_half_written_files(tmp_path):
    log = RolloutLog(tmp_path, LoggingConfig(rollouts_max_mb=0.005), CharTokenizer())  # a step: ~2 kB
    for step in range(1, 6):
        _step(log, step, [_group(0)])
    log.close()
    d = tmp_path / "rollouts"
    assert (d / "STOPPED").exists() and len(list(d.glob("*.jsonl"))) == 2
    (d / ".train_000004.jsonl.tmp").write_text('{"task"')  # a crash mid-write
    log = RolloutLog(tmp_path, LoggingConfig(rollouts_max_mb=0.005), CharTokenizer(), resume_step=1)
    _step(log, 2, [_group(0)])  # the cut freed room: step 2 is recorded again
    log.close()
    assert sorted(p.name for p in d.iterdir()) == ["train_000001.jsonl", "train_000002.jsonl"]


def test_a_record_that_cannot_be_made_never_raises_into_training(tmp_path, caplog):
    log = RolloutLog(tmp_path, LoggingConfig(), CharTokenizer())
    group = _group(0)
    log.train_step(1, [group], list(group), batch=object())  # no advantages: a trainer change the record missed
    group.trajectories[0].info["calls"] = 5  # not a list of calls
    log.evaluation(1, [group])
    log.close()
    assert not list((tmp_path / "rollouts").glob("*.jsonl"))
    assert "train step 1" in caplog.text and "evaluation at step 1" in caplog.text


def test_a_fresh_run_in_an_old_run_folder_starts_the_record_anew(tmp_path, caplog):
    old = RolloutLog(tmp_path, LoggingConfig(rollouts_max_mb=0.005), CharTokenizer())
    for step in range(1, 6):  # the old run hit its cap after 2 steps
        _step(old, step, [_group(0)])
    old.evaluation(2, [_group(1)])
    old.close()
    new = RolloutLog(tmp_path, LoggingConfig(rollouts_max_mb=0.005), CharTokenizer())  # not a resume
    _step(new, 1, [_group(3)])
    new.close()
    d = tmp_path / "rollouts"
    assert sorted(p.name for p in d.iterdir()) == ["train_000001.jsonl"]  # neither the old steps nor its STOPPED
    assert json.loads((d / "train_000001.jsonl").read_text())["task"]["id"] == "t3"
    assert "dropped an earlier run's rollout record (2 files)" in caplog.text
