"""`agentenv sft`: conversations replayed through the env train exactly the tokens RL trains; a 2-step run of the
tiny model through the CLI checkpoints, resumes and exports a model that `agentenv train` starts from."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from agentenv.cli import app
from agentenv.configs import config_from_dict
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.rollout import run_episode
from agentenv.training import checkpoint as ckpt
from agentenv.training.batching import collate
from agentenv.training.build import build_tools, make_env_factory
from agentenv.training.sft import build_examples, nll_loss, sft_batch

SYSTEM = "Answer the question. Use the search tool. Give the final answer as <answer>\\boxed{...}</answer>."


def tiny_config(tmp_path, **sft):
    return {
        "model": {"path": "tiny"},
        "policy": {"backend": "hf", "max_turn_tokens": 96},
        "env": {
            "tool_format": "hermes", "chat_template": "chatml_hermes", "tools": {"search": {"k": 3}},
            "tasks": {"source": "toy", "kinds": ["twohop"], "system_prompt": SYSTEM},
            "reward": "arpo", "max_tool_calls": 3, "max_context_tokens": 1024, "max_result_tokens": 256,
        },
        "sft": {"solver": "agentenv.toy.solver:solve", "examples": 2, "output_dir": str(tmp_path / "sft"), **sft},
        "trainer": {"output_dir": str(tmp_path / "rl")},
        "logging": {"tensorboard": False, "progress": False},
    }  # fmt: skip


def test_nll_loss_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])  # (B, T)
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert nll_loss(lp, mask, 3.0).item() == pytest.approx((2 + 3 + 4) / 3)
    assert nll_loss(lp[:1], mask[:1], 3.0).item() + nll_loss(lp[1:], mask[1:], 3.0).item() == pytest.approx(3.0)


def test_sft_mask_equals_the_rl_mask_token_for_token(tmp_path, tiny_model_path):
    """A solver's conversation and the same conversation read from a JSONL file (its tool results recorded) give
    the tokens and loss mask of an RL episode in which a policy writes those turns, token for token; the mask is 1
    exactly on the turns' text."""
    from transformers import AutoTokenizer

    from agentenv.toy.solver import solve

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    cfg = config_from_dict(tiny_config(tmp_path))
    solver_examples, _ = build_examples(cfg, tok)
    assert len(solver_examples.trajectories) == 2
    tasks = {t.id: t for t in cfg.env.tasks.load().train}
    tools = build_tools(cfg.env)
    make_env = make_env_factory(cfg.env, tools, tok)  # the RL trainer's env factory

    async def rl_rollout(task, turns):
        return await run_episode(ScriptedPolicy(tok, turns), make_env(), task, cfg.policy.sampling_params(), seed=3)

    records, rl_trajs = [], []
    for traj in solver_examples.trajectories:
        task = tasks[traj.task_id]
        turns = solve(task, tools, "hermes")
        rl = asyncio.run(rl_rollout(task, turns))
        assert rl.correct and rl.num_tool_calls == len(turns) - 1
        rl_trajs.append(rl)
        # the same conversation as a chat file: each call answered by a recorded tool message
        results = [asyncio.run(tools["search"](json.loads(t.split("<tool_call>")[1].split("</tool_call>")[0])
                                               ["arguments"]["query"])).text for t in turns[:-1]]  # fmt: skip
        msgs = [*task.messages]
        for turn, res in zip(turns, [*results, None]):
            msgs.append({"role": "assistant", "content": turn})
            if res is not None:
                msgs.append({"role": "tool", "content": res})
        records.append({"id": task.id, "messages": msgs})
        # the mask is 1 exactly on the policy's turns
        ids, mask = traj.token_ids, traj.loss_mask
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == "".join(turns)
        assert sum(mask) < len(ids) and sum(mask[: traj.prompt_len]) == 0

    data = tmp_path / "convs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    file_cfg = config_from_dict({**tiny_config(tmp_path), "sft": {"data": str(data), "examples": 2}})
    file_examples, _ = build_examples(file_cfg, tok)
    rl_batch = collate(rl_trajs, [torch.zeros(len(t)) for t in rl_trajs], pad_id=0)
    for examples in (solver_examples, file_examples):
        batch = sft_batch(examples.trajectories, pad_id=0)
        assert torch.equal(batch.input_ids, rl_batch.input_ids)
        assert torch.equal(batch.loss_mask, rl_batch.loss_mask)
        assert batch.loss_mask.sum() > 0


def test_two_sft_steps_on_the_tiny_model_checkpoint_resume_and_export(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(tmp_path, steps=2, batch_size=2, micro_batch_size=1, lr=1e-4, checkpoint_every=1,
                      keep_checkpoints=2)  # fmt: skip
    path = tmp_path / "sft.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(app, ["sft", str(path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    run = tmp_path / "sft"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(math.isfinite(x["sft/loss"]) and x["sft/policy_tokens"] > 0 for x in lines)
    assert [p.name for p in ckpt.complete_checkpoints(run)] == ["step_000001", "step_000002"]
    assert ckpt.verify(run / "checkpoints" / "step_000002") is None
    model = AutoModelForCausalLM.from_pretrained(out["model"])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    changed = [n for n, p in model.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert len(changed) > len(base.state_dict()) // 2

    # resume: one more step from step 2's checkpoint, the logs read like one run of 3 steps
    res = CliRunner().invoke(app, ["sft", str(path), "sft.steps=3", "--resume"])
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert ckpt.latest_checkpoint(run).name == "step_000003"

    # the RL trainer starts from the export
    rl = config_from_dict({**cfg, "model": {"path": out["model"]}})
    assert rl.model.path == str(run / "model")


def test_sft_needs_data_or_a_solver(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg["sft"] = {"data": str(tmp_path / "convs.txt")}
    with pytest.raises(Exception, match="sft.data"):
        config_from_dict(cfg)
    cfg["sft"] = {"data": str(tmp_path / "c.jsonl"), "solver": "agentenv.toy.solver:solve"}
    with pytest.raises(Exception, match="not both"):
        config_from_dict(cfg)


@pytest.mark.slow
def test_the_smollm2_recipe_runs_one_step_of_each_stage(tmp_path, smollm2_path):
    """configs/smollm2_sft_grpo.yaml, made small: one SFT step (the real sandbox answers the solver's calls), then
    one GRPO step that starts from the SFT export."""
    from agentenv.configs import load_config
    from agentenv.training.sft import SFTTrainer
    from agentenv.training.trainer import Trainer

    small = ["policy.backend=hf", "env.tools.python.pool_size=1", "logging.progress=false"]
    cfg = load_config("configs/smollm2_sft_grpo.yaml", [
        *small, "sft.examples=2", "sft.steps=1", "sft.batch_size=2", f"sft.output_dir={tmp_path / 'sft'}",
    ])  # fmt: skip
    result = SFTTrainer(cfg).train()
    assert result.metrics["examples"] == 2 and math.isfinite(result.metrics["sft/loss"])
    assert ckpt.verify(tmp_path / "sft" / "checkpoints" / "step_000001") is None
    rl = load_config("configs/smollm2_sft_grpo.yaml", [
        *small, f"model.path={result.model_dir}", "algorithm.group_size=2", "trainer.steps=1",
        "trainer.tasks_per_step=1", "trainer.mini_batch_tasks=1", "trainer.micro_batch_size=2",
        f"trainer.output_dir={tmp_path / 'rl'}",
    ])  # fmt: skip
    trainer = Trainer(rl)
    try:
        m = trainer.train_step(0)
    finally:
        trainer.close()
    assert m["rollout/trajectories"] == 2 and m["rollout/failed"] == 0, m
    assert math.isfinite(m["train/grad_norm"])
