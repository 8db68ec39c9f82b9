"""ARPO's tree sampler on the real async engine and real AgentEnvs.

The policy here plays scripted turns with entropies chosen by the test, so the
branching rule's input is known exactly; the env, the tools and the rollout
engine are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
from collections.abc import Callable

import pytest

from agentenv.algorithms.arpo import ARPO, ARPOConfig, TreeSampler
from agentenv.algorithms.base import group_generated_tokens
from agentenv.algorithms.grpo import IndependentSampler
from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.testing import (
    CounterTool,
    EchoTool,
    FailingTool,
    SleepTool,
    boxed_reward,
    build_test_tokenizer,
    make_task,
)
from agentenv.types import Generation, Group, SamplingParams

PARAMS = SamplingParams(max_tokens=64)

# turn_fn(node_text, seed) -> the turn's text; entropy_fn(node_text, position) -> entropy of that token
TurnFn = Callable[[str, int], str]
EntropyFn = Callable[[str, int], float]


def _last(hay: list[int], needle: list[int]) -> int:
    """Index just after the last occurrence of `needle` in `hay`, or -1."""
    n = len(needle)
    for i in range(len(hay) - n, -1, -1):
        if hay[i : i + n] == needle:
            return i + n
    return -1


class TreePolicy:
    """Plays a scripted turn per node (the context up to the last tool result or
    the prompt), chosen from the call's seed, with entropies the test chooses.

    A call whose prompt ends with part of a turn (a probe's tokens) continues
    that turn, as a real model continues its own tokens.
    """

    def __init__(self, tokenizer, turn_fn: TurnFn, entropy_fn: EntropyFn, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.turn_fn = turn_fn
        self.entropy_fn = entropy_fn
        self.delay_s = delay_s
        self.generated = 0
        self.calls: list[tuple[float, str, bool]] = []  # (time, node text, fresh turn) per call
        self._made: dict[tuple[int, ...], list[list[int]]] = {}
        self._marks = [
            tokenizer.encode("</result>", add_special_tokens=False),
            tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False),
        ]

    def enc(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        node = max(_last(prompt_ids, m) for m in self._marks)
        node_ids, partial = tuple(prompt_ids[:node]), prompt_ids[node:]
        node_text = self.tokenizer.decode(list(node_ids), skip_special_tokens=False)
        self.calls.append((time.monotonic(), node_text, not partial))
        made = self._made.setdefault(node_ids, [])
        if partial:  # continue the turn these tokens began
            turn = next(t for t in made if t[: len(partial)] == partial)
        else:
            turn = self.enc(self.turn_fn(node_text, params.seed or 0)) + [self.tokenizer.eos_token_id]
            made.append(turn)
        rest = turn[len(partial) :][: params.max_tokens]
        text = self.tokenizer.decode(turn[: len(partial) + len(rest)], skip_special_tokens=False)
        stop = next((s for s in params.stop if s in text), None)
        if stop is not None:  # cut right after the stop string, as a real policy does
            while rest and stop in self.tokenizer.decode(turn[: len(partial) + len(rest) - 1], skip_special_tokens=False):
                rest = rest[:-1]
        finish = "stop" if stop else ("eos" if rest and rest[-1] == self.tokenizer.eos_token_id else "length")
        ents = [self.entropy_fn(node_text, len(partial) + i) for i in range(len(rest))]
        self.generated += len(rest)
        return Generation(rest, [-0.5] * len(rest), ents, finish, stop)

    def load_weights(self, named_tensors) -> None:
        pass


TOK = build_test_tokenizer()


@pytest.fixture(scope="module")
def tok():
    return TOK


def env_factory(tok, tools_fn=lambda: [EchoTool("search")], **cfg) -> Callable[[], AgentEnv]:
    config = {"max_context_tokens": 2048, "max_result_tokens": 64, "max_tool_calls": 5, **cfg}
    return lambda: AgentEnv(tools_fn(), tok, reward_fn=boxed_reward, config=config)


def two_searches(node_text: str, seed: int) -> str:
    """search, search, answer; the seed picks the words, so independent samples differ."""
    calls = node_text.count("</result>")
    if calls < 2:
        return f"<think>s{seed % 9973}</think><search>q{calls} {seed % 97}</search>"
    return f"<answer>\\boxed{{{seed % 3 + 41}}}</answer>"


def entropy(first: float, after_tool: float) -> EntropyFn:
    """`first` on the first turn, `after_tool` on every turn after a tool result."""
    return lambda node_text, pos: after_tool if "</result>" in node_text else first


def run(sampler, policy, make_env, task=None, seed: int = 0) -> Group:
    return asyncio.run(sampler.sample(policy, make_env, task or make_task(), PARAMS, seed))


def assert_tree(group: Group, cfg: ARPOConfig) -> None:
    """Never more than M, distinct uids, every branch's prefix a copy of its parent's tokens."""
    trajs = group.trajectories
    assert len(trajs) == cfg.group_size
    assert len({t.uid for t in trajs}) == len(trajs)
    by_uid = {t.uid: t for t in trajs}
    for t in trajs:
        assert not t.failed, t.error
        if t.parent_uid is None:
            continue
        parent = by_uid[t.parent_uid]
        b = t.branch_token
        assert t.token_ids[:b] == parent.token_ids[:b]
        # the branch point is the node right after a tool result
        ends, pos = [], 0
        for s in t.segments:
            pos += len(s)
            if s.source == "tool":
                ends.append(pos)
        assert b in ends
        assert t.loss_mask[:b] == parent.loss_mask[:b]


# --------------------------------------------------------------------------- budget


def test_high_entropy_after_tools_spends_the_branch_budget_and_never_more_than_m(tok):
    cfg = ARPOConfig(group_size=16, initial_rollouts=8, forks_per_branch=2)
    policy = TreePolicy(tok, two_searches, entropy(first=1.0, after_tool=2.0))
    group = run(TreeSampler(cfg), policy, env_factory(tok))
    assert_tree(group, cfg)
    roles = [t.info["arpo"]["role"] for t in group.trajectories]
    assert roles.count("initial") == 8 and roles.count("branch") == 8 and roles.count("fill") == 0
    assert group.info["branches"] == 8 and group.info["fills"] == 0
    # beams of Z=2 until the slots run out: 4 branch points, later probes find no slot
    assert group.info["branch_points"] == 4
    assert all(d["branch"] for d in group.info["decisions"])
    # probes stop once the budget is spent (no wasted splits of turns)
    assert sum(d["forks"] for d in group.info["decisions"]) == 8


def test_low_entropy_never_branches_and_fills_with_fresh_samples(tok):
    cfg = ARPOConfig(group_size=16, initial_rollouts=8)
    policy = TreePolicy(tok, two_searches, entropy(first=2.0, after_tool=1.0))
    group = run(TreeSampler(cfg), policy, env_factory(tok))
    assert_tree(group, cfg)
    roles = [t.info["arpo"]["role"] for t in group.trajectories]
    assert roles.count("initial") == 8 and roles.count("fill") == 8
    assert all(t.parent_uid is None for t in group.trajectories)
    assert not any(d["branch"] for d in group.info["decisions"])
    # fresh samples, not copies: every token sequence differs (the seed picks the words)
    seqs = [tuple(t.token_ids) for t in group.trajectories]
    assert len(set(seqs)) == len(seqs)
    seeds = [t.info["seed"] for t in group.trajectories]
    assert len(set(seeds)) == len(seeds)


def test_partial_budget_gives_a_branch_point_only_the_slots_left(tok):
    cfg = ARPOConfig(group_size=5, initial_rollouts=2, forks_per_branch=2)  # 3 slots: 2 + 1
    policy = TreePolicy(tok, two_searches, entropy(first=1.0, after_tool=2.0))
    group = run(TreeSampler(cfg), policy, env_factory(tok))
    assert_tree(group, cfg)
    forks = [d["forks"] for d in group.info["decisions"] if d["forks"]]
    assert sorted(forks) == [1, 2]


def test_branches_that_end_early_leave_the_rest_to_fills(tok):
    # one tool call per path, and only the first tool result is uncertain: 2 branch points x Z=1
    def one_search(node_text: str, seed: int) -> str:
        if "</result>" not in node_text:
            return f"<search>q {seed % 89}</search>"
        return f"<answer>\\boxed{{{seed % 7}}}</answer>"

    cfg = ARPOConfig(group_size=8, initial_rollouts=2, forks_per_branch=1)
    policy = TreePolicy(tok, one_search, entropy(first=1.0, after_tool=3.0))
    group = run(TreeSampler(cfg), policy, env_factory(tok))
    assert_tree(group, cfg)
    roles = [t.info["arpo"]["role"] for t in group.trajectories]
    # branches do not call tools again, so they never branch: 2 branches, 4 fills
    assert roles.count("branch") == 2 and roles.count("fill") == 4


# --------------------------------------------------------------------------- branch points: real tool results only


def _result_before(group: Group, d: dict) -> str:
    """The text of the result block that ends right before a probe's node."""
    traj = next(t for t in group.trajectories if t.info["arpo"]["path"] == d["path"])
    text = TOK.decode(traj.token_ids[: d["token"]])
    return text[text.rindex("<result>") :]


def test_no_probe_or_branch_at_the_tool_call_limit_message(tok):
    """max_tool_calls=1: search, search again (the env answers "Tool-call limit reached"), answer.

    Only the first result is a tool's: each path probes once there. On the old code every path
    probed at the limit message too (where the only move left is to answer) and branched there.
    """

    def search_twice(node_text: str, seed: int) -> str:
        if node_text.count("</result>") < 2:
            return f"<search>q{node_text.count('</result>')} {seed % 97}</search>"
        return f"<answer>\\boxed{{{seed % 3 + 41}}}</answer>"

    cfg = ARPOConfig(group_size=8, initial_rollouts=2, forks_per_branch=1)
    policy = TreePolicy(tok, search_twice, entropy(first=1.0, after_tool=2.0))  # every probe says branch
    group = run(TreeSampler(cfg), policy, env_factory(tok, max_tool_calls=1))
    assert_tree(group, cfg)
    texts = [tok.decode(t.token_ids) for t in group.trajectories]
    assert all("Tool-call limit reached" in x for x in texts)  # every path did hit the limit
    decisions = group.info["decisions"]
    assert len(decisions) == 2 and all(d["tool_result"] == 1 for d in decisions)  # one per initial path
    for d in decisions:
        assert "echo: q0" in _result_before(group, d)
    # 2 branches (from the real results), which reach only the limit message: no more probes; 4 fills
    roles = [t.info["arpo"]["role"] for t in group.trajectories]
    assert roles.count("branch") == 2 and roles.count("fill") == 4
    for t in group.trajectories:
        if t.parent_uid is not None:
            assert "limit" not in tok.decode(t.token_ids[: t.branch_token])


def test_no_probe_at_a_malformed_calls_error(tok):
    """An empty <search></search> gets the env's error; only the real search after it is a branch point."""

    def malformed_then_search(node_text: str, seed: int) -> str:
        n = node_text.count("</result>")
        if n == 0:
            return f"<think>s{seed % 89}</think><search></search>"
        if n == 1:
            return f"<search>q {seed % 97}</search>"
        return f"<answer>\\boxed{{{seed % 3}}}</answer>"

    cfg = ARPOConfig(group_size=6, initial_rollouts=2, forks_per_branch=1)
    group = run(TreeSampler(cfg), TreePolicy(tok, malformed_then_search, entropy(1.0, 2.0)), env_factory(tok))
    assert_tree(group, cfg)
    assert all("Empty query" in tok.decode(t.token_ids) for t in group.trajectories)
    decisions = group.info["decisions"]
    assert len(decisions) == 2
    for d in decisions:
        before = _result_before(group, d)
        assert "echo: q" in before and "Empty query" not in before
    assert [t.tool_calls.get("invalid") for t in group.trajectories] == [1] * 6


def test_env_step_info_says_which_observations_are_tool_results(tok):
    env = env_factory(tok, max_tool_calls=1)()
    env.reset(options={"task": make_task()})
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    infos = [env.step(enc(turn))[4] for turn in ("<search></search>", "<search>a</search>", "<search>b</search>")]
    assert [i["tool_result"] for i in infos] == [False, True, False]  # malformed, real, limit


# --------------------------------------------------------------------------- N = M: GRPO's sampling


def test_n_equal_m_samples_exactly_grpos_group(tok):
    """No branch slots: no probe, and root i gets GRPO's episode seed, so the groups are equal token for token."""
    cfg = ARPOConfig(group_size=6, initial_rollouts=6)
    for seed in (0, 5):
        p_tree, p_grpo = (TreePolicy(tok, two_searches, entropy(1.0, 2.0)) for _ in range(2))
        tree = run(TreeSampler(cfg), p_tree, env_factory(tok), seed=seed)
        grpo = run(IndependentSampler(6), p_grpo, env_factory(tok), seed=seed)
        assert [t.token_ids for t in tree] == [t.token_ids for t in grpo]
        assert [t.logprobs for t in tree] == [t.logprobs for t in grpo]
        assert [t.reward for t in tree] == [t.reward for t in grpo]
        assert [t.info["seed"] for t in tree] == [t.info["seed"] for t in grpo]
        assert tree.info["decisions"] == [] and tree.info["branches"] == 0
        assert p_tree.generated == p_grpo.generated


# --------------------------------------------------------------------------- fork decisions


def test_per_fork_decisions_draw_a_coin_per_fork(tok):
    """The published code's reading: each of the Z forks flips its own coin, so a point gets 0..Z forks."""
    cfg = ARPOConfig(
        group_size=40, initial_rollouts=8, forks_per_branch=2, branch_rule="stochastic", fork_decision="per_fork",
        entropy_norm="none",
    )  # fmt: skip
    policy = TreePolicy(tok, two_searches, entropy(1.0, 1.0))  # ΔH = 0: each coin branches with probability τ
    group = run(TreeSampler(cfg), policy, env_factory(tok), seed=3)
    assert_tree(group, cfg)
    wanted = [d["forks_wanted"] for d in group.info["decisions"]]
    assert set(wanted) == {0, 1, 2}  # a single fork happens only when the coins disagree
    assert all(d["forks"] == d["forks_wanted"] for d in group.info["decisions"])  # the budget was never short
    # the paper's reading: one coin per point, Z forks or none
    paper = run(TreeSampler(dataclasses.replace(cfg, fork_decision="per_point")), policy, env_factory(tok), seed=3)
    assert {d["forks_wanted"] for d in paper.info["decisions"]} == {0, 2}


# --------------------------------------------------------------------------- entropy


def test_initial_entropy_is_reset_for_every_batch(tok):
    state = {"first": 5.0}
    policy = TreePolicy(tok, two_searches, lambda node, pos: 3.0 if "</result>" in node else state["first"])
    sampler = TreeSampler(ARPOConfig(group_size=4, initial_rollouts=2))
    g1 = run(sampler, policy, env_factory(tok), seed=1)
    assert g1.info["branches"] == 0  # H_t 3.0 < H_initial 5.0
    state["first"] = 1.0
    g2 = run(sampler, policy, env_factory(tok), seed=2)
    # with H_initial kept from the first batch (5.0, as the published code does) nothing would branch
    assert g2.info["branches"] == 2
    assert {t.info["arpo"]["h_initial"] for t in g2.trajectories} == {1.0}
    assert all(d["h_initial"] == 1.0 for d in g2.info["decisions"])


def test_entropies_are_per_token_means_over_k_tokens(tok):
    # the first k=4 tokens of the first turn average 1.0; tokens after them (9.0) are outside the window
    def ent(node_text: str, pos: int) -> float:
        if "</result>" in node_text:
            return [1.2, 1.2, 0.8, 1.6][pos] if pos < 4 else 0.0  # mean 1.2 over the k tokens after the result
        return 1.0 if pos < 4 else 9.0

    cfg = ARPOConfig(group_size=3, initial_rollouts=1, entropy_window=4, entropy_norm="none")
    group = run(TreeSampler(cfg), TreePolicy(tok, two_searches, ent), env_factory(tok))
    d = group.info["decisions"][0]
    assert d["h_initial"] == pytest.approx(1.0)
    assert d["h_t"] == pytest.approx(1.2)
    assert d["delta_h"] == pytest.approx(0.2)
    assert d["branch"]


def test_stochastic_rule_runs_within_budget_and_is_deterministic_under_a_seed(tok):
    # A budget that cannot run out (4 roots x 2 results, at most 3 branches each, 26 slots): which path takes
    # the last slot would depend on which tool call answers first, a race no seed decides. Within the budget
    # every probe's decision is its seed's, and records are compared by their place in the tree.
    cfg = ARPOConfig(group_size=30, initial_rollouts=4, forks_per_branch=1, branch_rule="stochastic",
                     entropy_norm="none")  # fmt: skip
    policy = TreePolicy(tok, two_searches, entropy(first=1.0, after_tool=1.0))  # ΔH = 0: probability τ

    def by_place(group):
        decisions = sorted((d["path"], d["tool_result"], d["branch"]) for d in group.info["decisions"])
        paths = sorted((t.info["arpo"]["path"], tuple(t.token_ids)) for t in group.trajectories)
        return decisions, paths

    a = run(TreeSampler(cfg), policy, env_factory(tok), seed=7)
    b = run(TreeSampler(cfg), policy, env_factory(tok), seed=7)
    assert_tree(a, cfg)
    assert by_place(a) == by_place(b)
    decisions = [d["branch"] for seed in range(4) for d in run(TreeSampler(cfg), policy, env_factory(tok), seed=seed).info["decisions"]]
    assert 0 < sum(decisions) < len(decisions)


# --------------------------------------------------------------------------- forks, async, failures


def test_a_branch_forks_the_env_state_at_the_node(tok):
    forks: list[CounterTool] = []
    tools = lambda: [CounterTool("python", registry=forks)]  # noqa: E731

    def count_twice(node_text: str, seed: int) -> str:
        calls = node_text.count("</result>")
        return "<python>tick</python>" if calls < 2 else "<answer>\\boxed{2}</answer>"

    cfg = ARPOConfig(group_size=3, initial_rollouts=1, forks_per_branch=2)
    group = run(TreeSampler(cfg), TreePolicy(tok, count_twice, entropy(1.0, 2.0)), env_factory(tok, tools))
    assert_tree(group, cfg)
    texts = [tok.decode(t.token_ids) for t in group.trajectories]
    # the branches fork the session after count=1; each then counts to 2 on its own (a shared session would reach 3)
    for text in texts:
        assert "count=1" in text and "count=2" in text and "count=3" not in text
    assert all(f.closed for f in forks)  # every path's session is closed


def test_branches_generate_while_another_path_waits_for_its_tool(tok):
    slow = 0.5

    def turns(node_text: str, seed: int) -> str:
        if "</result>" in node_text:
            return "<answer>\\boxed{42}</answer>"
        return "<sleep>long</sleep>" if seed % 2 else "<search>fast</search>"

    answered: list[float] = []  # when each slow call answered

    class TimedSleep(SleepTool):
        async def __call__(self, query: str):
            result = await super().__call__(query)
            answered.append(time.monotonic())
            return result

    def tools():
        return [EchoTool("search"), TimedSleep("sleep", slow)]

    policy = TreePolicy(tok, turns, entropy(1.0, 2.0))
    cfg = ARPOConfig(group_size=6, initial_rollouts=4, forks_per_branch=2)
    group = run(TreeSampler(cfg), policy, env_factory(tok, tools), seed=3)
    assert_tree(group, cfg)
    sleepers = [t for t in group.trajectories if t.tool_calls.get("sleep")]
    assert sleepers, "the seed should give at least one slow path"
    branches = [t for t in group.trajectories if t.info["arpo"]["role"] == "branch"]
    assert branches
    # fresh turns at fast nodes before the slow tool answered: one probe per fast path, plus the branches' turns
    fast_paths = sum(1 for t in group.trajectories if t.tool_calls.get("search") and t.parent_uid is None)
    # ordered against the first slow answer, not the clock: a loaded machine runs the fast turns late, in order
    early = [1 for t, node, fresh in policy.calls if "echo: fast" in node and fresh and t < min(answered)]
    assert len(early) == fast_paths + len(branches)


def test_a_failing_tool_fails_its_paths_not_the_group(tok):
    def turns(node_text: str, seed: int) -> str:
        return "<search>x</search>" if "</result>" not in node_text else "<answer>\\boxed{1}</answer>"

    cfg = ARPOConfig(group_size=4, initial_rollouts=2)
    group = run(TreeSampler(cfg), TreePolicy(tok, turns, entropy(1.0, 2.0)), env_factory(tok, lambda: [FailingTool()]))
    assert len(group) == 4
    assert all(t.failed and "unreachable" in t.error for t in group.trajectories)
    assert all(t.loss_mask == [0] * len(t) for t in group.trajectories)


class UnforkableTool(CounterTool):
    """A session that cannot be copied once it holds state (fork raises)."""

    def fork(self) -> UnforkableTool:
        if self.count:
            raise RuntimeError("session cannot be copied")
        return UnforkableTool(self.name)


def test_a_failed_fork_returns_its_slot_and_the_parent_goes_on(tok):
    def turns(node_text: str, seed: int) -> str:
        return "<python>t</python>" if "</result>" not in node_text else f"<answer>\\boxed{{{seed % 5}}}</answer>"

    cfg = ARPOConfig(group_size=4, initial_rollouts=2)
    group = run(TreeSampler(cfg), TreePolicy(tok, turns, entropy(1.0, 2.0)), env_factory(tok, lambda: [UnforkableTool()]))
    assert_tree(group, cfg)
    roles = [t.info["arpo"]["role"] for t in group.trajectories]
    assert roles.count("initial") == 2 and roles.count("fill") == 2
    assert all("cannot be copied" in d["fork_errors"][0] for d in group.info["decisions"] if d["branch"])
    assert group.info["branch_points"] == 0


def test_same_seed_same_tree(tok):
    cfg = ARPOConfig(group_size=8, initial_rollouts=4)
    policy = TreePolicy(tok, two_searches, entropy(1.0, 2.0))
    a, b = (run(TreeSampler(cfg), policy, env_factory(tok), seed=11) for _ in range(2))
    c = run(TreeSampler(cfg), policy, env_factory(tok), seed=12)

    def tree(g):  # path label -> (tokens, branch point): a path's seed comes from its place in the tree, while the
        # order paths start in follows when their tool results come back (framed off the loop, in a thread)
        return {t.info["arpo"]["path"]: (t.token_ids, t.branch_token) for t in g.trajectories}

    assert len(tree(a)) == len(a.trajectories) == 8
    assert tree(a) == tree(b)
    assert tree(a)["i0"][0] != tree(c)["i0"][0]  # another seed: the first initial path already differs


# --------------------------------------------------------------------------- token accounting


def test_arpo_generates_fewer_tokens_than_grpo_for_the_same_group_size(tok):
    """M=16, N=8 against G=16 on the same tasks: the shared prefixes are generated once."""
    tasks = [make_task(task_id=f"t{i}") for i in range(3)]
    arpo_cfg = ARPOConfig(group_size=16, initial_rollouts=8)
    rows = []
    for i, task in enumerate(tasks):
        p_arpo = TreePolicy(tok, two_searches, entropy(1.0, 2.0))
        arpo = run(TreeSampler(arpo_cfg), p_arpo, env_factory(tok), task, seed=i)
        p_grpo = TreePolicy(tok, two_searches, entropy(1.0, 2.0))
        grpo = run(IndependentSampler(16), p_grpo, env_factory(tok), task, seed=i)
        assert len(arpo) == len(grpo) == 16
        # what the policy generated, counted three ways
        assert arpo.info["generated_tokens"] == p_arpo.generated == group_generated_tokens(arpo)
        assert group_generated_tokens(grpo) == p_grpo.generated == sum(t.num_policy_tokens for t in grpo)
        shared = sum(t.num_policy_tokens for t in arpo) - arpo.info["generated_tokens"]
        assert shared > 0
        rows.append((task.id, p_arpo.generated, p_grpo.generated, shared))
    arpo_total, grpo_total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print("\ntask | ARPO M=16,N=8 generated | GRPO G=16 generated | ARPO copied prefix tokens")
    for r in rows:
        print(" | ".join(map(str, r)))
    assert arpo_total < grpo_total


# --------------------------------------------------------------------------- the plugin


def test_arpo_plugin_samples_and_scores_a_tree(tok):
    algo = ARPO(ARPOConfig(group_size=6, initial_rollouts=2, advantage="hard"))
    group = run(algo.sampler(), TreePolicy(tok, two_searches, entropy(1.0, 2.0)), env_factory(tok), seed=5)
    advs = algo.advantages(group)
    assert [a.shape[0] for a in advs] == [len(t) for t in group.trajectories]
    assert algo.group_size() == len(group) == 6


# --------------------------------------------------------------------------- Python session (Docker)


def _docker_ok() -> bool:
    if shutil.which("docker") is None and not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001
        return False


def python_session_turns(node_text: str, seed: int) -> str:
    """x = 41; then, chosen by the seed, `x += 1; print(x)` or `print(x)`; then print(x) again; then answer."""
    calls = node_text.count("</result>")
    if calls == 0:
        return "<python>x = 41</python>"
    if calls == 1:
        return "<python>x += 1; print(x)</python>" if seed % 2 else "<python>print(x)</python>"
    if calls == 2:
        return "<python>print(x)</python>"
    return "<answer>\\boxed{42}</answer>"


@pytest.mark.docker
@pytest.mark.skipif(not _docker_ok(), reason="needs a running Docker daemon")
def test_a_branch_keeps_the_live_python_session_of_its_parent_and_diverges_after(tok):
    from agentenv.tools.python_sandbox import PythonSandboxConfig, PythonTool

    proto = PythonTool(PythonSandboxConfig(mode="session", pool_size=1))
    cfg = ARPOConfig(group_size=3, initial_rollouts=1, forks_per_branch=2)
    policy = TreePolicy(tok, python_session_turns, entropy(first=1.0, after_tool=2.0))
    try:
        group = run(TreeSampler(cfg), policy, env_factory(tok, lambda: [proto]), seed=2)
    finally:
        asyncio.run(proto.aclose())
    assert_tree(group, cfg)
    parent = next(t for t in group.trajectories if t.parent_uid is None)
    branches = [t for t in group.trajectories if t.parent_uid is not None]
    assert len(branches) == 2 and {t.parent_uid for t in branches} == {parent.uid}

    def results(t) -> list[str]:
        return [tok.decode(s.token_ids).replace("<result>", "").replace("</result>", "").strip() for s in t.segments if s.source == "tool"]

    incremented = 0
    for t in group.trajectories:
        r = results(t)
        assert len(r) == 3, r
        text = tok.decode(t.token_ids)
        if "x += 1" in text:  # this path changed x: it sees 42, twice
            assert r[1:] == ["42", "42"]
            incremented += 1
        else:  # x = 41 from the parent's session, untouched by a sibling's x += 1
            assert r[1:] == ["41", "41"]
    # the seed gives both kinds of path, so the divergence is shown
    assert 0 < incremented < 3


# --------------------------------------------------------------------------- what ARPO did: the step's arpo/* metrics


def _sum_reduce(t):
    return t


def test_tree_metrics_of_a_scripted_tree_whose_branches_are_known(tok):
    """M=8, N=2, Z=1; ΔH = +1 after the first search (branch), -0.5 after the second (no branch).

    Known tree: i0 and i1 fork once each after their first result (2 branches, 2 branch points); every
    later probe (the initials' second results, the branches' own result) says no: 6 probes in all; the
    4 unused slots go to fills. Tool results: initials 2 + 2, branches 1 + 1 of their own, fills 4 x 2.
    """
    from agentenv.algorithms.arpo.metrics import tree_metrics

    def ent(node_text: str, pos: int) -> float:
        return {0: 1.0, 1: 2.0}.get(node_text.count("</result>"), 0.5)

    cfg = ARPOConfig(group_size=8, initial_rollouts=2, forks_per_branch=1, entropy_norm="none")
    group = run(TreeSampler(cfg), TreePolicy(tok, two_searches, ent), env_factory(tok))
    assert_tree(group, cfg)
    m = ARPO(cfg).rollout_metrics([group], _sum_reduce)
    assert m == pytest.approx({
        "arpo/trees": 1.0,
        "arpo/branches_per_tree": 2.0,
        "arpo/branch_points_per_tree": 2.0,
        "arpo/branch_points_per_traj": 2 / 8,
        "arpo/fills_per_tree": 4.0,
        "arpo/probes_per_tree": 6.0,
        "arpo/delta_h_after_tool": (2 * 1.0 + 4 * -0.5) / 6,
        "arpo/delta_h_at_branch": 1.0,
        "arpo/branch_share_of_tools": 2 / 14,
        "arpo/budget_out": 0.0,
        "arpo/forks_refused": 0.0,
    }, abs=1e-12)  # fmt: skip
    # two trees of the same kind pool to the same means, and count 2 trees
    assert tree_metrics([group, group], cfg.branch_budget)["arpo/trees"] == 2.0
    assert tree_metrics([group, group], cfg.branch_budget)["arpo/delta_h_at_branch"] == pytest.approx(1.0)


def test_tree_metrics_when_the_budget_runs_out(tok):
    """Every probe branches with Z=2 until the M - N = 8 slots are gone: budget out, refused forks counted."""
    cfg = ARPOConfig(group_size=16, initial_rollouts=8, forks_per_branch=2, entropy_norm="none")
    group = run(TreeSampler(cfg), TreePolicy(tok, two_searches, entropy(first=1.0, after_tool=2.0)), env_factory(tok))
    assert_tree(group, cfg)
    m = ARPO(cfg).rollout_metrics([group], _sum_reduce)
    decisions = group.info["decisions"]
    wanted = 2 * len(decisions)
    # a branch forked after result r of its parent pays for the 2 - r searches after it
    branch_calls = sum(d["forks"] * (2 - d["tool_result"]) for d in decisions if d["path"].startswith("i"))
    branch_calls += sum(d["forks"] * (1 - d["tool_result"]) for d in decisions if not d["path"].startswith("i"))
    assert m["arpo/branches_per_tree"] == 8 and m["arpo/branch_points_per_tree"] == 4 and m["arpo/fills_per_tree"] == 0
    assert m["arpo/budget_out"] == 1.0
    assert m["arpo/forks_refused"] == pytest.approx((wanted - 8) / wanted)
    assert m["arpo/delta_h_after_tool"] == pytest.approx(1.0) and m["arpo/delta_h_at_branch"] == pytest.approx(1.0)
    assert m["arpo/branch_share_of_tools"] == pytest.approx(branch_calls / (8 * 2 + branch_calls))


def test_a_tree_that_never_probes_logs_no_undefined_mean_and_grpo_logs_nothing(tok):
    cfg = ARPOConfig(group_size=4, initial_rollouts=4)  # N = M: no slot, no probe
    group = run(TreeSampler(cfg), TreePolicy(tok, two_searches, entropy(1.0, 2.0)), env_factory(tok))
    m = ARPO(cfg).rollout_metrics([group], _sum_reduce)
    assert "arpo/delta_h_after_tool" not in m and "arpo/delta_h_at_branch" not in m and "arpo/forks_refused" not in m
    assert m["arpo/branches_per_tree"] == 0 and m["arpo/budget_out"] == 0 and m["arpo/branch_share_of_tools"] == 0
    from agentenv.algorithms.grpo import GRPO

    assert GRPO().rollout_metrics([group], _sum_reduce) == {}
