"""The trainer on the tiny model: weights change, the policy serves them, metrics are logged."""

from __future__ import annotations

import json

import pytest
import torch

from agentenv.configs import config_from_dict
from agentenv.training.metrics import read_metrics
from agentenv.training.scoring import sequence_logprobs
from agentenv.training.trainer import Trainer


def test_few_steps_change_weights_and_policy_serves_them(fast_config):
    trainer = Trainer(fast_config)
    assert not trainer.updater.pack  # trainer.pack_prefixes=auto packs trees only; a GRPO group shares only its prompt
    before = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    sample_ids = None
    try:
        # a step moves the weights only when some group's rewards differ: sample until one does
        learned = False
        for step in range(6):
            metrics = trainer.train_step(step)
            assert metrics["rollout/failed"] == 0
            learned = learned or metrics["train/grad_norm"] > 0
            if learned:
                break
        assert learned, "no group had differing rewards in 6 steps"
        assert 0.0 <= metrics["rollout/accuracy"] <= 1.0
        # sampler and trainer share fp32 weights: their logprobs agree closely
        assert metrics["train/logprob_gap_mean"] < 1e-3, metrics
        after = trainer.unwrapped().state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert changed, "no weight changed after two training steps"
        # the rollout policy now holds the trainer's weights: same logprobs
        task = trainer.rt.tasks.train[0]
        from agentenv.tasks.prompts import render_prompt

        sample_ids = torch.tensor([render_prompt(trainer.rt.tokenizer, task.messages)])
        with torch.no_grad():
            want, _ = sequence_logprobs(trainer.unwrapped(), sample_ids)
            got, _ = sequence_logprobs(trainer.rt.policy.model, sample_ids)
        assert torch.allclose(want, got, atol=1e-5)
    finally:
        trainer.close()


def test_train_writes_metrics_checkpoints_and_eval(fast_overrides, tmp_path):
    """... and an evaluation sampled at 0.7 with a greedy one beside it, each with its per-task records."""
    cfg = config_from_dict({}, [*fast_overrides, "trainer.eval_temperature=0.7", "trainer.eval_greedy=true"])
    result = Trainer(cfg).train()
    out = result.output_dir
    records = read_metrics(out / "metrics.jsonl")
    steps = [r["step"] for r in records if "rollout/reward" in r]
    assert steps == [1, 2]
    for key in ("rollout/reward", "rollout/tool_calls_per_traj", "rollout/gen_tokens_per_group", "rollout/entropy",
                "rollout/tool_results_per_group",
                "train/clip_frac", "train/logprob_gap_mean", "time/step_s"):
        assert key in records[0], key
    parts = ("time/rollout_s", "time/old_logprobs_s", "time/update_s", "time/push_s")
    for r in (r for r in records if "rollout/reward" in r):  # the step itemized; the parts fit in the step
        assert all(r[k] > 0 for k in parts), r
        assert sum(r[k] for k in parts) <= r["time/step_s"], r
    assert (out / "checkpoints" / "step_000002" / "trainer_state.json").exists()
    assert (out / "checkpoints" / "step_000002" / "model" / "config.json").exists()
    assert result.final_eval is not None and result.final_eval.n_tasks == 2
    report = json.loads((out / "eval.json").read_text())
    for rep in (report, report["greedy"]):  # per task: the records the accuracy is the mean of
        tasks = rep["per_task"]
        assert len(tasks) == 2 and all(len(t["correct"]) == 1 == len(t["reward"]) for t in tasks)
        assert rep["accuracy"] == pytest.approx(sum(c for t in tasks for c in t["correct"]) / 2)
        assert rep["tool_calls"] == pytest.approx(sum(t["tool_calls"] for t in tasks) / 2)
    assert [t["task"] for t in report["per_task"]] == [t["task"] for t in report["greedy"]["per_task"]]
    assert records[-1]["eval_greedy/accuracy"] == report["greedy"]["accuracy"]
    assert records[-1]["eval/accuracy"] == report["accuracy"]


def test_the_progress_bar_itemizes_the_step():
    from agentenv.training.metrics import describe

    text = describe({"rollout/reward": 0.25, "rollout/accuracy": 0.5, "time/rollout_s": 4.04,
                      "time/old_logprobs_s": 1.2, "time/update_s": 8.0, "time/push_s": 0.31})  # fmt: skip
    assert text == "r=0.25 acc=0.50 | roll 4.0 lp 1.2 upd 8.0 push 0.3 s"
