"""The embedded tiny model: its tokenizer, traces, cache and lock, and the built model itself."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from agentenv.errors import ConfigError
from agentenv.toy.tiny import TinyBuildConfig, ensure_tiny_model, load_tiny_tokenizer
from agentenv.toy.tiny.tokenizer import TAGS
from agentenv.toy.tiny.traces import ReferencePythonTool, eval_print_arithmetic

KINDS = ("arith", "twohop", "both")


# ---------------------------------------------------------------- without the built model


def test_config_rejects_head_dim_other_than_64():
    with pytest.raises(ConfigError, match="tiny.hidden_size.*64"):
        TinyBuildConfig(hidden_size=128, num_heads=4)
    with pytest.raises(ConfigError, match="tiny.max_position_embeddings"):
        TinyBuildConfig(max_position_embeddings=1024, max_context_tokens=1024)
    with pytest.raises(ConfigError, match="tiny.nope"):
        ensure_tiny_model(nope=1)


def test_cache_key_follows_config():
    a, b = TinyBuildConfig(), TinyBuildConfig(sft_steps=TinyBuildConfig().sft_steps + 1)
    assert a.cache_key() == TinyBuildConfig().cache_key() != b.cache_key()
    # Runtime-only knobs do not change the build.
    assert TinyBuildConfig(threads=1).cache_key() == a.cache_key()


def test_reference_python_tool_evaluates_reference_code_only():
    assert eval_print_arithmetic("print(12 * 34)") == "408\n"
    assert eval_print_arithmetic("print(abs(1860 - 1918))") == "58\n"
    tool = ReferencePythonTool()
    ok = asyncio.run(tool("print(99999 + 1)"))
    assert ok.ok and ok.text == "100000"
    bad = asyncio.run(tool("import os\nprint(os.getcwd())"))
    assert not bad.ok and bad.error
    assert not asyncio.run(tool("print(2 ** 10)")).ok
    assert tool.fork() is tool


def test_tokenizer_specials_tags_digits_and_chat_template():
    tok = load_tiny_tokenizer()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for tag in TAGS:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag
        # Tags are not special: the env parses turns decoded with skip_special_tokens=True.
        assert tok.decode(ids, skip_special_tokens=True) == tag
    digits = tok.encode("print(4821 * 917)", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in digits]
    assert ["4", "8", "2", "1"] == pieces[2:6]
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    assert 512 <= len(tok) <= 4096
    assert tok.decode(tok.encode("Page 1: Stakton\nx")) == "Page 1: Stakton\nx"


def test_traces_are_token_exact_and_masked(tmp_path):
    from agentenv.tasks.prompts import render_prompt
    from agentenv.toy.tasks import ToyConfig, build_toy_suite, reference_turns
    from agentenv.toy.tiny.traces import make_tools, make_traces_async

    tok = load_tiny_tokenizer()
    suite = build_toy_suite(ToyConfig(n_arith_train=2, n_twohop_train=2, n_both_train=2, n_arith_heldout=0,
                                      n_twohop_heldout=0, n_both_heldout=0))  # fmt: skip
    tools = make_tools(suite.write_corpus(tmp_path / "c.jsonl"), 3)
    traces, dropped = asyncio.run(make_traces_async(suite.train, tools, tok, 256, 2048))
    assert dropped == 0 and {t.kind for t in traces} == set(KINDS)
    by_id = {t.id: t for t in suite.train}
    for tr in traces:
        task = by_id[tr.task_id]
        prompt = render_prompt(tok, task.messages)
        assert tr.token_ids[: len(prompt)] == prompt and not any(tr.loss_mask[: len(prompt)])
        # The masked-in runs are exactly the reference turns, as the policy would emit them.
        runs, cur = [], []
        for t, m in zip(tr.token_ids, tr.loss_mask):
            if m:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        runs.append(cur)
        assert [tok.decode(r) for r in runs] == reference_turns(task)
        tool_text = tok.decode([t for t, m in zip(tr.token_ids[len(prompt):], tr.loss_mask[len(prompt):]) if not m])
        assert tool_text.count("<result>") == len(task.metadata["solution"])


def test_estimate_is_the_result_rounded_to_two_significant_digits():
    from agentenv.toy.tiny.traces import estimate

    assert estimate(4400900) == 4400000
    assert estimate(1749267) == 1700000
    assert estimate(-4021) == -4000
    assert (estimate(385), estimate(395)) == (380, 400)  # a tie rounds to even, as round() does
    assert estimate(99) == 99  # short results are exact: no estimate trace for them


def test_estimate_traces_skip_the_tool_and_answer_well_formed_but_wrong(tmp_path):
    from agentenv.tasks.prompts import render_prompt
    from agentenv.tasks.rewards import arpo_reward
    from agentenv.toy.tasks import ToyConfig, build_toy_suite
    from agentenv.toy.tiny.traces import (
        ESTIMATE_THINK,
        estimate_turns,
        make_tools,
        make_traces_async,
        pick_estimates,
    )  # fmt: skip

    tok = load_tiny_tokenizer()
    suite = build_toy_suite(ToyConfig(n_arith_train=10, n_twohop_train=2, n_both_train=2, n_arith_heldout=0,
                                      n_twohop_heldout=0, n_both_heldout=0))  # fmt: skip
    picked = pick_estimates(suite.train, 0.5, seed=0)
    by_id = {t.id: t for t in suite.train}
    assert len(picked) == 5 and {by_id[i].metadata["kind"] for i in picked} == {"arith"}
    assert pick_estimates(suite.train, 0.5, seed=0) == picked != pick_estimates(suite.train, 0.5, seed=1)
    tools = make_tools(suite.write_corpus(tmp_path / "c.jsonl"), 3)
    traces, dropped = asyncio.run(make_traces_async(suite.train, tools, tok, 256, 2048, estimate_ids=picked))
    assert dropped == 0 and len(traces) == len(suite.train)
    estimates = [tr for tr in traces if tr.estimate]
    assert {tr.task_id for tr in estimates} == picked  # none of these results is round
    for tr in estimates:
        task = by_id[tr.task_id]
        prompt = render_prompt(tok, task.messages)
        assert tr.token_ids[: len(prompt)] == prompt
        assert all(tr.loss_mask[len(prompt):])  # one policy turn, no tool result
        (turn,) = estimate_turns(task)
        assert tok.decode(tr.token_ids[len(prompt):]) == turn and ESTIMATE_THINK in turn
        r = arpo_reward(turn, task, {})
        assert r.format_ok and not r.correct and r.score == 0.0
    # The tool traces of the other arithmetic tasks are untouched.
    assert sum(tr.kind == "arith" and not tr.estimate for tr in traces) == 5
    with pytest.raises(ValueError, match="arithmetic"):
        estimate_turns(next(t for t in suite.train if t.metadata["kind"] == "twohop"))


def test_copy_weights_mark_content_carried_over_from_question_and_results():
    import torch

    from agentenv.toy.tiny.sft import copy_weights

    # prefix (system prompt) 1 2 3 | question 7 8 9 | policy 7 4 8 | result 5 3 | policy 9 3 5
    ids = torch.tensor([[1, 2, 3, 7, 8, 9, 7, 4, 8, 5, 3, 9, 3, 5]])
    mask = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]]).bool()
    w = copy_weights(ids, mask, 3, 5.0)
    # 7, 8, 9 and 5 were carried over; 4 is new; 3 is in the system prompt, so it is no copy.
    assert w.tolist() == [[0, 0, 0, 0, 0, 0, 5, 1, 5, 0, 0, 5, 1, 5]]
    assert torch.equal(copy_weights(ids, mask, 3, 1.0), mask.float())


def test_space_twins_start_with_one_identity_and_a_common_space_direction():
    import torch

    from agentenv.toy.tiny.circuits import _A, _D, install_copy_circuit, space_twins
    from agentenv.toy.tiny.sft import make_model

    tok = load_tiny_tokenizer()
    twins = space_twins(tok)
    pairs = {(tok.convert_ids_to_tokens(a), tok.convert_ids_to_tokens(b)) for a, b in twins}
    # A name opens mid-sentence as " M..." and at a line start or after a tag as "M...".
    spaced_first = tok.encode(" Maskmere", add_special_tokens=False)[0]
    plain_first = tok.encode("Maskmere", add_special_tokens=False)[0]
    assert (plain_first, spaced_first) in twins and ("M", "ĠM") in pairs
    assert all(tok.convert_ids_to_tokens(b) == "Ġ" + tok.convert_ids_to_tokens(a) for a, b in twins)

    cfg = TinyBuildConfig()
    model = make_model(cfg, tok)
    for h in install_copy_circuit(model, twins=twins, seed=0):
        h.remove()
    emb = model.model.embed_tokens.weight.detach()
    plain, spaced = (torch.tensor(x) for x in zip(*twins))
    torch.testing.assert_close(emb[plain, _A], emb[spaced, _A], rtol=0, atol=0)
    assert emb[plain, _D].abs().max() == 0  # the plain spelling carries no space direction
    space = emb[spaced, _D]
    assert space.norm(dim=1).min() > 0 and torch.equal(space, space[:1].expand_as(space))
    # Different word pieces still differ.
    assert not torch.equal(emb[plain[0], _A], emb[plain[1], _A])


def test_pointer_head_prefers_recent_positions_and_leaves_the_induction_head_alone():
    import torch

    from agentenv.toy.tiny.circuits import install_copy_circuit
    from agentenv.toy.tiny.sft import make_model

    tok = load_tiny_tokenizer()
    ids = torch.randint(100, len(tok), (1, 300), generator=torch.Generator().manual_seed(0))
    attn = {}
    for recency in (0.0, 20.0):
        model = make_model(TinyBuildConfig(), tok)
        for h in install_copy_circuit(model, pointer_recency=recency, seed=0):
            h.remove()
        model.set_attn_implementation("eager")  # returns attention weights
        with torch.no_grad():
            attn[recency] = model(input_ids=ids, output_attentions=True).attentions[1][0, :, -1]  # (heads, T)
    # The pointer heads' queries start at zero: without the recency term head 3 attends evenly...
    torch.testing.assert_close(attn[0.0][3], torch.full((300,), 1 / 300))
    # ...with it, its weight falls with distance from the last position over the context.
    by_distance = attn[20.0][3].flip(0)[[0, 10, 50, 100, 200]]
    assert all(a > b for a, b in zip(by_distance, by_distance[1:])), by_distance
    assert by_distance[0] > 1000 * by_distance[3]
    # The induction head (2) and the content-only pointer heads (0, 1) are the same either way.
    torch.testing.assert_close(attn[0.0][:3], attn[20.0][:3], rtol=0, atol=0)


@pytest.mark.parametrize("freeze", [True, False])
def test_sft_keeps_the_copy_circuit_fixed_and_trains_the_rest(freeze):
    import torch

    from agentenv.toy.tiny.circuits import frozen_parts
    from agentenv.toy.tiny.sft import init_model, train_sft
    from agentenv.toy.tiny.traces import Trace

    tok = load_tiny_tokenizer()
    cfg = TinyBuildConfig(sft_steps=3, warmup_steps=1, weight_decay=0.0, freeze_circuit=freeze)
    model, hooks = init_model(cfg, tok)
    g = torch.Generator().manual_seed(0)
    traces = []
    for i in range(4):  # a shared prefix, then a question and a policy turn
        ids = [7, 8, 9] + torch.randint(100, len(tok), (30 + i,), generator=g).tolist()
        traces.append(Trace(f"t{i}", "arith", ids, [0] * 13 + [1] * (20 + i)))
    always, full = ([(p, idx, p.detach()[idx].clone()) for p, idx in frozen_parts(model, f)] for f in (False, True))
    pointer_q = model.model.layers[1].self_attn.q_proj.weight[192:256].detach().clone()
    train_sft(model, traces, cfg, tok.pad_token_id, log=lambda m: None)
    for h in hooks:
        h.remove()

    def changed(parts):
        return [not torch.equal(p.detach()[idx], before) for p, idx, before in parts]

    # The previous-token heads' q/k rows never train; the rest of the circuit is fixed only with
    # freeze_circuit, and without it every other part of it trains.
    assert not any(changed(always))
    assert sum(changed(full)) == (0 if freeze else len(full) - len(always)), changed(full)
    # The pointer head's query learns either way.
    assert not torch.equal(model.model.layers[1].self_attn.q_proj.weight[192:256], pointer_q)


def test_ensure_builds_once_under_the_lock(tmp_path, monkeypatch):
    from agentenv.toy.tiny import build as build_mod

    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    calls = []

    def fake_build(out_dir, cfg, log=None):
        calls.append(cfg.cache_key())
        time.sleep(0.3)
        out = Path(out_dir)
        (out / "config.json").write_text("{}")
        (out / "build_info.json").write_text(json.dumps({"ok": True}))
        return {"ok": True}

    monkeypatch.setattr(build_mod, "build_tiny_model", fake_build)
    paths = []
    other = {"seed": 1}  # not the shipped build: built, not copied
    threads = [
        threading.Thread(target=lambda: paths.append(ensure_tiny_model(log=lambda m: None, **other))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(paths)) == 1 and paths[0].parent == tmp_path / "tiny"
    assert ensure_tiny_model(log=lambda m: None, **other) == paths[0] and len(calls) == 1
    ensure_tiny_model(force=True, log=lambda m: None, **other)
    assert len(calls) == 2
    assert not [p for p in (tmp_path / "tiny").iterdir() if ".tmp-" in p.name]


def test_tiny_build_command_takes_field_overrides(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentenv.cli import app

    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    runner = CliRunner()
    bad = runner.invoke(app, ["tiny", "build", "nope=1"])
    assert bad.exit_code == 2 and "tiny.nope" in bad.output
    bad_value = runner.invoke(app, ["tiny", "build", "sft_steps=0"])
    assert bad_value.exit_code == 2 and "tiny.sft_steps" in bad_value.output
    assert not (tmp_path / "tiny").exists() or not any((tmp_path / "tiny").iterdir())  # nothing was built
    # A real build, kept small by the overrides.
    small = ["sft_steps=2", "n_train_arith=4", "n_train_twohop=2", "n_train_both=2", "n_heldout=1", "eval_max_tokens=8"]
    res = runner.invoke(app, ["tiny", "build", *small])
    assert res.exit_code == 0, res.output
    path = Path(res.output.strip().splitlines()[-1])
    assert path.parent == tmp_path / "tiny" and path.name == TinyBuildConfig(
        sft_steps=2, n_train_arith=4, n_train_twohop=2, n_train_both=2, n_heldout=1, eval_max_tokens=8
    ).cache_key()
    info = json.loads((path / "build_info.json").read_text())
    assert info["config"]["sft_steps"] == 2 and info["sft"]["steps"] == 2
    assert info["traces"]["kept"] == {"arith": 4, "twohop": 2, "both": 2}
    assert info["traces"]["estimates"] == round(4 * TinyBuildConfig().estimate_share) > 0


# ---------------------------------------------------------------- the built model


@pytest.mark.slow
def test_tiny_model_loads_with_auto_classes(tiny_model_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((tiny_model_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64 and cfg.get("head_dim", 64) == 64
    assert cfg["max_position_embeddings"] >= 2048
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    assert model.dtype == torch.float32
    n = sum(p.numel() for p in model.parameters())
    assert 2e6 <= n <= 10e6
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token_id == model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert load_tiny_tokenizer().get_vocab() == tok.get_vocab()


def test_build_info_reports_partial_heldout_scores(tiny_model_path):
    info = json.loads((tiny_model_path / "build_info.json").read_text())
    assert info["params"] > 1e6 and info["build_seconds"] > 0
    greedy, sampled = (info["heldout"][m]["accuracy"] for m in ("greedy", "sampled"))
    assert set(greedy) == set(sampled) == set(KINDS)
    # evaluated as the toy run configs sample: their temperature and context budget
    from agentenv.configs import load_config

    toy = load_config(Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml")
    assert info["env"]["sampled_temperature"] == toy.policy.temperature
    assert info["env"]["max_context_tokens"] == toy.env.max_context_tokens
    # Clear but partial over the held-out suite, with room to improve on every kind.
    assert 0.1 <= sum(greedy.values()) / len(KINDS) <= 0.9, greedy
    assert sum(sampled.values()) > 0, sampled
    assert all(acc <= 0.9 for acc in greedy.values()), greedy
    # The python kind is solved partly when sampled too: RL's sampled groups carry a signal there.
    assert 0.1 <= greedy["arith"] <= 0.9 and 0.1 <= sampled["arith"] <= 0.9, (greedy, sampled)
    # Some arithmetic traces skip the tool, so sampling sometimes answers without python (greedy
    # takes the tool): what RL is to train away.
    calls = {m: info["heldout"][m]["tool_calls"]["arith"] for m in ("greedy", "sampled")}
    assert info["traces"]["estimates"] > 0 and calls["sampled"] < calls["greedy"], (info["traces"], calls)


def test_every_kind_is_partially_solved_greedy_and_sometimes_sampled(tiny_model_path):
    """Every kind is solved in part greedy, and sampled at the toy runs' temperature some of
    the time: RL's groups find a reward on every kind, with room to improve."""
    info = json.loads((tiny_model_path / "build_info.json").read_text())
    greedy, sampled = (info["heldout"][m]["accuracy"] for m in ("greedy", "sampled"))
    for kind in KINDS:
        assert 0.1 <= greedy[kind] <= 0.9, (kind, greedy)
        assert 0.0 < sampled[kind] <= 0.9, (kind, sampled)


@pytest.mark.slow
def test_first_hop_query_copies_the_heldout_name_from_the_question(tiny_model_path):
    """Held-out names are unseen in training: the first query must copy them token by token."""
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig
    from agentenv.tasks.prompts import render_prompt
    from agentenv.toy.tasks import load_toy_tasks, reference_turns
    from agentenv.types import SamplingParams

    policy = HFPolicy(HFPolicyConfig(model=str(tiny_model_path), device="cpu"))
    tasks = load_toy_tasks(("twohop",), split="heldout", n=16)
    params = SamplingParams(max_tokens=48, temperature=0.0, stop=("</search>",))

    async def first_turns():
        prompts = [render_prompt(policy.tokenizer, t.messages) for t in tasks]
        return await asyncio.gather(*(policy.generate(p, params) for p in prompts))

    gens = asyncio.run(first_turns())
    right = [policy.tokenizer.decode(g.token_ids) == reference_turns(t)[0] for t, g in zip(tasks, gens)]
    # Chance is ~0 (the names are unseen); the SFT copies 9 of 16.
    assert sum(right) >= 6, [policy.tokenizer.decode(g.token_ids) for g in gens]


@pytest.mark.slow
def test_tiny_model_solves_a_heldout_task_through_the_hf_policy(tiny_model_path, tmp_path):
    import torch

    from agentenv.policies.hf import HFPolicy, HFPolicyConfig
    from agentenv.toy.tasks import ToyConfig, build_toy_suite
    from agentenv.toy.tiny.evaluate import evaluate_policy
    from agentenv.toy.tiny.traces import make_tools
    from agentenv.training.scoring import sequence_logprobs

    info = json.loads((tiny_model_path / "build_info.json").read_text())
    policy = HFPolicy(HFPolicyConfig(model=str(tiny_model_path), device="cpu"))
    suite = build_toy_suite(ToyConfig(n_arith_train=0, n_twohop_train=0, n_both_train=0, n_arith_heldout=8,
                                      n_twohop_heldout=0, n_both_heldout=0))  # fmt: skip
    tools = make_tools(suite.write_corpus(tmp_path / "c.jsonl"), info["env"]["search_k"])
    res = asyncio.run(
        evaluate_policy(policy, suite.heldout, tools, policy.tokenizer, temperature=0.0, max_turn_tokens=96,
                        max_result_tokens=256, max_context_tokens=2048)  # fmt: skip
    )
    assert res["format_ok"]["arith"] >= 0.5 and res["accuracy"]["arith"] > 0.0
    # The sampler's logprobs are the trainer's.
    prompt = policy.tokenizer.encode("<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
    from agentenv.types import SamplingParams

    g = policy.generate_sync(prompt, SamplingParams(max_tokens=20, temperature=1.0, seed=0, stop=("</python>",)))
    with torch.no_grad():
        lp, _ = sequence_logprobs(policy.model, torch.tensor([prompt + g.token_ids]))
    torch.testing.assert_close(lp[0, len(prompt) - 1 :], torch.tensor(g.logprobs), atol=1e-4, rtol=0)
