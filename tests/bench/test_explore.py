"""The equal-tool-budget measurement: the env keeps the budget, every arm spends exactly B; the records; the
matched-attempt arm; the random tree; the metrics from crafted records."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

import pytest

from agentenv.algorithms.arpo.sampler import fork_draws
from agentenv.bench.explore import (
    INDEPENDENT,
    MATCHED,
    BudgetedEnv,
    ExploreConfig,
    ToolBudget,
    TrajRecord,
    answer_node,
    default_trees,
    explore,
)
from agentenv.bench.explore_report import compare, pass_at_k, report, task_stats, top_scored, vote
from agentenv.envs.testing import EchoTool, boxed_reward, build_test_tokenizer, make_task
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.types import Generation, SamplingParams

TOK = build_test_tokenizer()
TURNS = ["<search>first</search>", "<search>second</search>", "<answer>\\boxed{42}</answer>"]

TOOLS: dict[int, EchoTool] = {}  # id(budget) -> the tool its envs call (EchoTool.fork is itself: one call list)


def env_for(budget: ToolBudget):
    tool = TOOLS[id(budget)] = EchoTool("search")
    config = {"max_context_tokens": 2048, "max_result_tokens": 64, "max_tool_calls": 5}
    return lambda: BudgetedEnv([tool], TOK, reward_fn=boxed_reward, config=config, budget=budget)


class SeededAnswers:
    """Searches twice, then answers 42 or 7 by the call's seed (so extra answers differ from their sources)."""

    def __init__(self) -> None:
        self.tokenizer = TOK
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, params):
        self.prompts.append(list(prompt_ids))
        text = TOK.decode(list(prompt_ids))
        n = text.count("echo:")
        turn = "<search>q</search>" if n < 2 and "budget spent" not in text else (
            f"<answer>\\boxed{{{42 if random.Random(params.seed).random() < 0.5 else 7}}}</answer>")  # fmt: skip
        ids = TOK.encode(turn, add_special_tokens=False)
        if len(ids) > params.max_tokens:  # a probe: the tests give it a window longer than any turn
            raise AssertionError(f"turn of {len(ids)} tokens asked in {params.max_tokens}")
        return Generation(ids, [-0.5] * len(ids), [0.1] * len(ids), "stop")

    def load_weights(self, named_tensors):
        return None


def _run(cfg, policy, tasks, budgets=None):
    got = budgets if budgets is not None else []
    return asyncio.run(explore(cfg, policy, lambda b: (got.append(b), env_for(b))[1], TOK, tasks,
                               SamplingParams(max_tokens=64)))  # fmt: skip


@pytest.mark.parametrize("B", [1, 5, 8])
def test_every_arm_spends_exactly_b_tool_calls_counted_by_the_env_and_by_its_records(B):
    """Every trajectory searches twice, then answers. The trees' probes all branch (α = 1 > τ; the random tree
    at τ = 1), so they fork; GRPO starts waves of 2 episodes. The env grants B calls and refuses the rest in every
    arm, and the records' own paid calls add up to B."""
    cfg = ExploreConfig(budgets=(B,), cap_per_call=2, width=2, arpo={"alpha": 1.0, "beta": 0.0},
                        trees=default_trees(random_tau=1.0), tasks_at_once=3)  # fmt: skip
    tasks = [make_task(task_id=f"t{i}") for i in range(3)]
    budgets: list[ToolBudget] = []
    recs = _run(cfg, ScriptedPolicy(TOK, TURNS), tasks, budgets)
    arms = [a for a in cfg.arms if a != MATCHED]
    assert len(budgets) >= len(arms) * len(tasks)
    sampled = budgets[: len(arms) * len(tasks)]
    assert all(len(TOOLS[id(b)].calls) == B and b.used == B for b in sampled)  # the tool ran exactly B times
    for t in tasks:
        for arm in cfg.arms:
            rs = [r for r in recs if r.task_id == t.id and r.arm == arm]
            assert rs and all(not r.failed for r in rs)
            assert sum(r.paid for r in rs) == B, (arm, rs)  # each granted call counted once, by the env that made it
            assert len(rs) <= cfg.cap(B)
            assert any(r.correct for r in rs) and {r.answer for r in rs if r.answer} == {"42"}
    trees = [r for r in recs if r.arm in cfg.trees]
    if B >= 2:
        assert any(r.role == "branch" and r.parent is not None and r.reread_tokens > 0 for r in trees)
    assert all(r.role == "root" and r.parent is None for r in recs if r.arm == INDEPENDENT)


def test_an_episode_after_the_budget_does_not_start_and_a_call_past_it_is_refused():
    budget = ToolBudget(1)
    env = env_for(budget)()
    env.reset(options={"task": make_task()})
    enc = lambda s: TOK.encode(s, add_special_tokens=False)  # noqa: E731
    _, _, done, _, info = env.step(enc("<search>a</search>"))
    assert info["tool_result"] and budget.used == 1 and not done and env.paid == 1
    fork = env.fork()
    assert fork.paid == 0
    _, _, _, _, info = fork.step(enc("<search>b</search>"))  # a fork draws on the same budget
    assert not info["tool_result"] and budget.used == 1 and budget.refused == 1 and fork.refused == 1
    assert "Tool budget spent" in TOK.decode(list(fork.context))
    assert fork.trajectory().info["budget"] == {"paid": 0, "refused": 1}
    with pytest.raises(Exception, match="tool budget of 1 calls is spent"):
        env_for(budget)().reset(options={"task": make_task()})


def test_the_matched_arm_spends_exactly_the_tree_s_attempts_and_no_tool_call():
    """GRPO's trajectories, then extra answers from their contexts after the last paid result: as many attempts as
    the arpo tree made, no call granted to an extra (the replay re-runs only calls the source paid), and each extra
    starts from its source's context token for token."""
    cfg = ExploreConfig(budgets=(4,), cap_per_call=4, width=2, arpo={"alpha": 1.0, "beta": 0.0, "entropy_window": 64},
                        tasks_at_once=2)  # fmt: skip
    tasks = [make_task(task_id=f"t{i}") for i in range(2)]
    policy = SeededAnswers()
    budgets: list[ToolBudget] = []
    recs = _run(cfg, policy, tasks, budgets)
    n_sampled = len(cfg.arms) - 1  # grpo and the trees; then one budget per extra, of exactly its source's calls
    extras_budgets = budgets[n_sampled * len(tasks):]
    for t in tasks:
        tree = [r for r in recs if r.task_id == t.id and r.arm == "arpo" and r.attempt]
        grpo = [r for r in recs if r.task_id == t.id and r.arm == INDEPENDENT]
        matched = [r for r in recs if r.task_id == t.id and r.arm == MATCHED]
        extras = [r for r in matched if r.role == "extra"]
        assert len(tree) > len(grpo) >= 1  # the tree answers more often: the arm has something to match
        assert sum(r.attempt for r in matched) == len(tree)
        assert [dataclasses.replace(r, arm=INDEPENDENT) for r in matched[: len(grpo)]] == grpo
        assert all(r.paid == 0 and not r.failed for r in extras)
        assert sum(r.paid for r in matched) == sum(r.paid for r in grpo) == 4
        by_uid = {r.uid: r for r in grpo}
        assert all(r.parent in by_uid and r.reread_tokens > 0 for r in extras)
        assert [r.order for r in matched] == list(range(len(matched)))
    for b in extras_budgets:  # each extra's budget: its source's paid calls, all re-run, nothing more granted
        assert b.used == b.total == len(TOOLS[id(b)].calls) == 2
    assert {r.answer for r in recs if r.role == "extra"} == {"42", "7"}  # new samples, not copies of the sources


def test_an_extra_answer_starts_after_the_last_paid_tool_result():
    from agentenv.types import Segment, Trajectory

    p = lambda n: Segment("policy", [1] * n, [0.0] * n, [0.0] * n)  # noqa: E731
    segs = [Segment("prompt", [9] * 5), p(2), Segment("tool", [3] * 4), p(2), Segment("tool", [3] * 3), p(2)]
    calls = [{"segment": 2, "tool": "search"}, {"segment": 4, "tool": "invalid"}]  # the second was refused
    traj = Trajectory(task_id="t", segments=segs, info={"calls": calls})
    assert answer_node(traj) == (3, 1)
    assert answer_node(Trajectory(task_id="t", segments=segs[:2], info={"calls": []})) == (1, 0)


def test_the_random_tree_has_the_tree_s_m_n_z_and_differs_only_in_where_it_branches():
    """Config: only the rule's fields differ. Run: the scripted policy's entropy is constant (ΔH = 0), so the
    threshold rule (α = τ = 0.5: branch iff ΔH > 0) never branches while the random tree branches exactly at the
    probes whose own draw u <= τ; both probe after every tool result while slots remain."""
    cfg = ExploreConfig(budgets=(8,), cap_per_call=2, width=2, trees=default_trees(random_tau=0.5), tasks_at_once=4)
    from agentenv.rollout.engine import derive_seed

    tree, rnd = cfg.arpo_config("arpo", 8), cfg.arpo_config("arpo_random", 8)
    diff = {f.name for f in dataclasses.fields(tree) if getattr(tree, f.name) != getattr(rnd, f.name)}
    assert diff == {"branch_rule", "beta"} and tree.tau == rnd.tau == 0.5  # α = τ = 0.5 is the run's default
    assert (tree.group_size, tree.initial_rollouts, tree.forks_per_branch) == (16, 2, 2)
    assert (rnd.group_size, rnd.initial_rollouts, rnd.forks_per_branch) == (16, 2, 2)
    recs = _run(cfg, ScriptedPolicy(TOK, TURNS), [make_task(task_id=f"t{i}") for i in range(4)])
    entropy = [r for r in recs if r.arm == "arpo"]
    rand = [r for r in recs if r.arm == "arpo_random"]
    assert sum(len(r.probes) for r in entropy) > 0 and not any(b for r in entropy for _, b in r.probes)
    assert all(dh == 0.0 for r in rand for dh, _ in r.probes)
    branched = [b for r in rand for _, b in r.probes]
    assert 0 < sum(branched) < len(branched)
    roots = [x for x in rand if x.role == "root"]  # the initial paths start first: order i is root i
    assert roots and all(x.probes for x in roots)
    for rec in roots:  # a root's decisions: its own draws (derive_seed(seed, i)), one per tool result, in order
        for i, (_, b) in enumerate(rec.probes, start=1):
            assert b == (fork_draws(rnd, derive_seed(rec.seed, rec.order), i)[0] <= 0.5)


# --------------------------------------------------------------------------- metrics from crafted records
def _rec(task: str, arm: str, order: int, answer: str | None, correct: bool, score: float = -1.0, **kw) -> TrajRecord:
    base = dict(task_id=task, kind="k", arm=arm, budget=4, seed=0, order=order, uid=f"{task}{arm}{order}", parent=None,
                role="root", branch_token=0, paid=1, refused=0, gen_tokens=10, reread_tokens=0, answer=answer,
                correct=correct, score=score, failed=False, finish="answer")  # fmt: skip
    return TrajRecord(**{**base, **kw})


def test_majority_vote_and_best_of_n_disagree_where_they_should():
    """Two wrong 7s and one right 42: best-of-n (pass@budget) solves it, the vote does not; the policy scores the
    42 highest, so top-scored does. A tie goes to the answer given first; a failed trajectory is no attempt."""
    rs = [_rec("a", "x", 0, "7", False, -2.0), _rec("a", "x", 1, "42", True, -0.1), _rec("a", "x", 2, "7", False, -1.0)]
    s = task_stats(rs)[4, "x", "a"]
    assert (s.passed, s.majority, s.top_scored, s.attempts) == (True, False, True, 3)
    assert s.acc_per_traj == pytest.approx(1 / 3)
    tie = [_rec("b", "x", 1, "7", False), _rec("b", "x", 0, "42", True)]
    assert vote(tie) is True  # 42 came first in start order
    assert vote([_rec("c", "x", 0, None, False)]) is False and top_scored([_rec("c", "x", 0, None, False)]) is False
    failed = _rec("d", "x", 0, "42", True, failed=True)
    assert task_stats([failed, _rec("d", "x", 1, "7", False)])[4, "x", "d"].attempts == 1
    assert not task_stats([failed, _rec("d", "x", 1, "7", False)])[4, "x", "d"].passed


def test_pass_at_k_is_read_at_the_fewest_attempts_any_arm_made():
    """The tree's 6 answers (2 right), the matched arm's 3 (1 right), GRPO's 2 (1 right): all read at k = 2."""
    tree = [_rec("a", "arpo", i, "42" if i < 2 else "7", i < 2) for i in range(6)]
    matched = [_rec("a", "grpo_matched", i, "42" if i == 2 else "7", i == 2) for i in range(3)]
    grpo = [_rec("a", "grpo", i, "42" if i == 0 else "7", i == 0) for i in range(2)]
    st = task_stats(tree + matched + grpo)
    assert st[4, "arpo", "a"].k == st[4, "grpo_matched", "a"].k == st[4, "grpo", "a"].k == 2
    assert st[4, "arpo", "a"].pass_at_k == pytest.approx(1 - math.comb(4, 2) / math.comb(6, 2))  # 0.6
    assert st[4, "grpo_matched", "a"].pass_at_k == pytest.approx(2 / 3)
    assert st[4, "grpo", "a"].pass_at_k == 1.0  # both of its two answers are read: the right one among them
    assert pass_at_k(3, 0, 2) == 0.0 and pass_at_k(3, 2, 2) == 1.0 and pass_at_k(0, 0, 0) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(1, 1, 2)


def test_comparisons_pair_by_task_with_mcnemar_and_holm():
    """arpo solves 6 tasks by best-of-n that grpo does not and loses none; its vote is no better (0 / 0 discordant)."""
    recs = []
    for i in range(10):
        t = f"t{i}"
        recs += [_rec(t, "grpo", 0, "7", False)]
        recs += [_rec(t, "arpo", 0, "7", False), _rec(t, "arpo", 1, "7", False), _rec(t, "arpo", 2, "42", i < 6)]
    text, rows, comps = report(recs)
    c = {x.metric: x for x in comps if x.arm == "arpo" and x.against == "grpo"}
    assert c["pass@budget"].discordant == (6, 0) and c["pass@budget"].diff.mean == pytest.approx(0.6)
    assert c["pass@budget"].p == pytest.approx(2 / 2**6)  # exact McNemar: 2 · P(X <= 0), X ~ Bin(6, 1/2)
    assert c["majority"].discordant == (0, 0) and c["majority"].p == 1.0
    # Holm: the paired t tests of acc/traj and pass@1 (1/3 on 6 tasks, 0 on 4) have the two smallest p, so
    # pass@budget's is the third smallest of the 5 and is multiplied by 5 - 2
    assert sorted(comps, key=lambda x: x.p)[2] is c["pass@budget"]
    assert c["pass@budget"].p_holm == pytest.approx(3 * c["pass@budget"].p)
    assert c["majority"].p_holm == 1.0
    arpo = next(r for r in rows if r.arm == "arpo")
    assert arpo.cells["pass@budget"].low >= 0.0 and arpo.cells["attempts"].mean == 3.0  # Wilson: never below 0
    assert arpo.most == 3 and next(r for r in rows if r.arm == "grpo").most == 1
    assert "| 4 | arpo − grpo | pass@budget | +0.600" in text
    assert compare(task_stats(recs), ["grpo"]) == []  # no pair, no comparison


def test_calibration_matches_the_random_tree_s_rate_and_puts_the_minority_threshold_at_a_quantile():
    from agentenv.bench.explore_report import calibrate

    dh = [i / 100 - 0.5 for i in range(101)]  # ΔH from -0.5 to 0.5; the rule branched where ΔH > 0.2 (30 probes)
    recs = [_rec("a", "arpo", 0, "7", False, probes=[[x, x > 0.2] for x in dh]), _rec("a", "grpo", 0, "7", False)]
    rand, tau, note = calibrate(recs, alpha=0.5, beta=0.2)
    assert rand == pytest.approx(30 / 101, abs=1e-4)
    assert tau == pytest.approx(0.5 + 0.2 * 0.25)  # q75 of ΔH is 0.25
    assert "30 probes" not in note and "101 probes" in note
    with pytest.raises(ValueError, match="no probe"):
        calibrate([_rec("a", "grpo", 0, "7", False)], 0.5, 0.2)
    with pytest.raises(ValueError, match="no probability"):
        calibrate(recs, alpha=0.9, beta=1.0)
