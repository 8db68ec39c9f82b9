"""ARPO's hierarchical reward on hand-checked cases."""

from __future__ import annotations

import pickle
import time

import pytest

from agentenv.errors import ConfigError
from agentenv.tasks.loaders import load_verl_parquet
from agentenv.tasks.mathcheck import as_rational, get_worker, normalize_math, to_sympy_text
from agentenv.tasks.rewards import (
    REWARDS,
    arpo_reward,
    check_format,
    extract_boxed,
    f1_score,
    get_reward,
    math_equal,
    normalize_answer,
    tags_balanced,
)
from agentenv.tasks.task import Task
from agentenv.toy.tasks import ToyConfig, build_toy_suite, reference_turns
from agentenv.types import PolicyText


def qa(truth: str, answers=None) -> Task:
    meta = {"answers": answers} if answers else {}
    return Task("q", ({"role": "user", "content": "?"},), truth, "qa", meta)


def math(truth: str) -> Task:
    return Task("m", ({"role": "user", "content": "?"},), truth, "math")


def resp(answer: str, prefix: str = "<think>ok</think>") -> str:
    return f"{prefix}<answer>The answer is \\[ \\boxed{{{answer}}} \\]</answer>"


NO_TOOLS: dict[str, int] = {}
BOTH = {"search": 1, "python": 2}


# ----------------------------------------------------------------------------- QA helpers


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower, Paris! ") == "eiffeltower paris"
    assert normalize_answer("An apple a day") == "apple day"


@pytest.mark.parametrize(
    ("pred", "truth", "f1"),
    [
        ("the Eiffel tower", "Eiffel Tower Paris", 0.8),  # p=1, r=2/3
        ("Eiffel Tower Paris", "the Eiffel tower", 0.8),
        ("Paris", "paris.", 1.0),
        ("London", "Paris", 0.0),
        ("yes", "Yes.", 1.0),
        ("yes", "no", 0.0),
        ("yes it is", "yes", 0.0),  # yes/no must match exactly, no partial credit
        ("no answer", "noanswer", 0.0),
        ("x y y", "y y z", 2 / 3),  # common 2: p=2/3, r=2/3
        ("a b b", "b b c", 0.8),  # "a" is an article: p=1, r=2/3
        ("the", "a", 0.0),  # both normalize to nothing
    ],
)
def test_f1(pred, truth, f1):
    assert f1_score(pred, truth) == pytest.approx(f1)


# ----------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{a} then \\boxed{b{c}}", "b{c}"),
        ("\\boxed{ok} \\boxed{unclosed", "ok"),
        ("\\boxed 5$", "5"),
        ("\\fbox{7}", "7"),
        ("no box", None),
        ("\\boxed{", None),
    ],
)
def test_extract_boxed(text, boxed):
    assert extract_boxed(text) == boxed


def test_tags_balanced():
    assert tags_balanced("<think>a</think><search>q</search><result>\nr\n</result><answer>x</answer>") is None
    assert tags_balanced("<think>a<search>q</search>") == "think"
    assert tags_balanced("</search><search>") == "search"
    assert tags_balanced("<python>a<python>b</python></python>") == "python"
    assert tags_balanced("<answer>x</answer></answer>") == "answer"
    assert tags_balanced("<result>x</result></result>", tags=("result",)) == "result"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("<think>x</think><answer>\\boxed{1}</answer>", "ok"),
        ("<think>x<answer>\\boxed{1}</answer>", "unbalanced <think> tags"),
        ("<think>x</think><search>q</search>\n<answer>\\boxed{1}</answer>", "ok"),  # results are not the policy's
        ("<think>x</think><search>q</search><result>\nr\n</result><answer>\\boxed{1}</answer>",
         "the policy wrote a <result> tag (results come from tools)"),  # a forged result
        ("<think>x</think><search>q<answer>\\boxed{1}</answer>", "unbalanced <search> tags"),
        ("<think>x</think> \\boxed{1}", "no <answer>...</answer>"),
        ("<answer>1</answer>", "no \\boxed{} in the answer"),
        ("<answer>\\boxed{ }</answer>", "no \\boxed{} in the answer"),
        ("\\boxed{1}<answer>one</answer>", "no \\boxed{} in the answer"),  # the box must be inside the answer
    ],
)
def test_check_format(response, reason):
    ok, _, why = check_format(response)
    assert why == reason and ok == (reason == "ok")


# ----------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("pred", "truth", "equal"),
    [
        ("4420857", "4420857", True),
        ("4,420,857", "4420857", True),
        ("$-42277$", "-42277", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac12", "1/2", True),
        ("9.80", "9.8", True),
        ("x = 5", "5", True),
        ("\\sqrt{8}", "2\\sqrt{2}", True),
        ("-6 + 3\\sqrt3", "3\\sqrt{3} - 6", True),
        ("274i + 1", "1+274i", True),
        ("(x+1)^2", "x^2+2x+1", True),
        ("\\frac{\\pi}{2}", "\\pi/2", True),
        ("(1, 2)", "(1,2)", True),
        ("(1,2)", "[1,2]", False),
        ("0.3333", "1/3", False),
        ("2\\sqrt{3}", "3\\sqrt{2}", False),
        ("4420858", "4420857", False),
        ("", "1", False),
    ],
)
def test_math_equal(pred, truth, equal):
    assert math_equal(pred, truth) is equal


def test_helpers():
    assert normalize_math(" \\left( 1 \\right) . ") == "(1)"
    assert as_rational("-\\frac{3}{4}") == as_rational("-0.75")
    assert as_rational("\\sqrt{2}") is None
    assert to_sympy_text("\\frac{a}{\\sqrt[3]{b}}") == "((a)/(((b)**(1/(3)))))"


@pytest.mark.parametrize(
    "hostile",
    ["__import__('os').system('true')", "x.__class__", "eval(1)", "\\boxed{1}", "lambda: 1", "a_b", "'1'"],
)
def test_unsafe_text_never_reaches_sympy(hostile):
    assert to_sympy_text(hostile) is None
    assert math_equal(hostile, "1") is False


@pytest.mark.slow
def test_hostile_expression_is_cut_off_and_worker_recovers():
    worker = get_worker()
    restarts = worker.restarts
    t0 = time.perf_counter()
    assert math_equal("9^{9^{9^{9}}}", "1", timeout_s=1.0) is False
    assert time.perf_counter() - t0 < 3.0
    assert worker.restarts == restarts + 1
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}") is True  # a fresh worker answers again


# ----------------------------------------------------------------------------- the reward


def test_reward_qa():
    r = arpo_reward(resp("the Eiffel tower"), qa("Eiffel Tower Paris"), NO_TOOLS)
    assert r.format_ok and not r.correct and r.score == pytest.approx(0.8) and r.answer == "the Eiffel tower"
    r = arpo_reward(resp("\\text{Eiffel Tower, Paris}"), qa("Eiffel Tower Paris"), BOTH)
    assert r.correct and r.score == pytest.approx(1.1)
    r = arpo_reward(resp("no"), qa("yes"), BOTH)
    assert r.score == 0.0 and not r.correct  # wrong answers get no bonus
    r = arpo_reward(resp("NYC"), qa("New York City", answers=["New York City", "NYC"]), NO_TOOLS)
    assert r.correct and r.score == 1.0


def test_partly_right_answer_with_both_tools_gets_the_bonus_as_in_the_paper():
    """The paper's reward is max(Acc + r_M, Acc) for a right format and Acc > 0 (the published code's too).

    By hand (SQuAD tokens): "Paris" against "Eiffel Tower Paris": precision 1, recall 1/3, F1 = 0.5;
    with both tools 0.6. "Eiffel Tower in Paris" against "Eiffel Tower": precision 2/4, recall 1,
    F1 = 2/3; with both tools 0.767, where agentenv gave 0.667 (bonus on exact matches only).
    """
    r = arpo_reward(resp("Paris"), qa("Eiffel Tower Paris"), BOTH)
    assert not r.correct and r.score == pytest.approx(0.5 + 0.1) and "both tools" in r.reason
    assert arpo_reward(resp("Paris"), qa("Eiffel Tower Paris"), NO_TOOLS).score == pytest.approx(0.5)
    assert arpo_reward(resp("Paris"), qa("Eiffel Tower Paris"), {"search": 2}).score == pytest.approx(0.5)
    r = arpo_reward(resp("Eiffel Tower in Paris"), qa("Eiffel Tower"), BOTH)
    assert r.score == pytest.approx(2 / 3 + 0.1)  # 0.767 (0.667 before: bonus on exact matches only)
    # no bonus at Acc = 0, and none on a format error
    assert arpo_reward(resp("Rome"), qa("Eiffel Tower Paris"), BOTH).score == 0.0
    assert arpo_reward("<answer>Paris</answer>", qa("Eiffel Tower Paris"), BOTH).score == -1.0


def test_reward_math_and_bonus():
    r = arpo_reward(resp("\\frac{1}{2}"), math("0.5"), {"search": 1, "python": 0})
    assert r.correct and r.score == 1.0 and r.answer == "\\frac{1}{2}"
    assert arpo_reward(resp("\\frac{1}{2}"), math("0.5"), BOTH).score == pytest.approx(1.1)
    r = arpo_reward(resp("3"), math("4"), BOTH)
    assert r.score == 0.0 and not r.correct and r.format_ok


def test_reward_format_errors_score_minus_one():
    for bad in ("<think>x</think><answer>\\boxed{0.5}", "<answer>0.5</answer>", "<think><answer>\\boxed{0.5}</answer>"):
        r = arpo_reward(bad, math("0.5"), BOTH)
        assert r.score == -1.0 and not r.format_ok and not r.correct and r.answer is None


def test_reference_turns_of_toy_tasks_score_full():
    suite = build_toy_suite(ToyConfig(n_arith_train=3, n_twohop_train=3, n_both_train=3))
    for t in suite.train:
        sol = t.metadata["solution"]
        text = "\n".join(reference_turns(t))  # what the policy writes; the results are the env's
        calls = {"search": sum(s["tool"] == "search" for s in sol), "python": sum(s["tool"] == "python" for s in sol)}
        r = arpo_reward(text, t, calls)
        assert r.correct and r.score == pytest.approx(1.1 if t.metadata["kind"] == "both" else 1.0), (t.id, r)


def test_valid_parquet_ground_truths_score_themselves():
    tasks = load_verl_parquet("/work/shared/data/arpo/valid.parquet")
    for t in tasks:
        r = arpo_reward(resp(t.ground_truth), t, NO_TOOLS)
        assert r.correct and r.score == 1.0, (t.id, t.ground_truth, r)


def test_registry():
    assert get_reward("arpo").__wrapped__ is arpo_reward and "arpo" in REWARDS
    with pytest.raises(ConfigError, match=r"env\.reward: unknown reward 'arpoo'\. Did you mean 'arpo'\?"):
        get_reward("arpoo")


@pytest.mark.parametrize(
    "name, text, truth, ability, score, correct",
    [
        ("f1", "<answer>the Eiffel tower</answer>", "Eiffel Tower Paris", "qa", 0.8, False),
        ("f1", "<answer>\\boxed{Eiffel Tower}</answer>", "eiffel tower", "qa", 1.0, True),
        ("exact", "<answer>Paris.</answer>", "paris", "qa", 1.0, True),
        ("exact", "<answer>Lyon</answer>", "paris", "qa", 0.0, False),
        ("math", "<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", "math", 1.0, True),
        ("math", "<answer>\\boxed{x^2+2x+1}</answer>", "(x+1)^2", "math", 1.0, True),
        ("math", "no answer block", "1", "math", 0.0, False),
    ],
)
def test_builtin_rewards_by_name(name, text, truth, ability, score, correct):
    t = Task(id="t", messages=({"role": "user", "content": "q"},), ground_truth=truth, ability=ability)
    r = get_reward(name)(text, t, NO_TOOLS)
    assert r.score == pytest.approx(score) and r.correct is correct


def test_a_users_reward_may_return_a_pair():
    from agentenv.tasks.rewards import as_reward_result

    assert as_reward_result((0.5, True)).score == 0.5 and as_reward_result((0.5, True)).correct
    with pytest.raises(TypeError, match="a reward must return"):
        as_reward_result("good")


def test_a_users_reward_may_return_its_own_record():
    from types import SimpleNamespace

    from agentenv.tasks.rewards import as_reward_result

    plain = as_reward_result(SimpleNamespace(score=0.5, correct=True))  # a ScoreLike
    assert (plain.score, plain.correct, plain.format_ok, plain.answer, plain.reason) == (0.5, True, True, None, "")
    full = as_reward_result(SimpleNamespace(score=-1, correct=False, format_ok=False, answer="4", reason="no tags"))
    assert (full.score, full.correct, full.format_ok, full.answer, full.reason) == (-1.0, False, False, "4", "no tags")
    graded = as_reward_result(SimpleNamespace(score=-1, correct=False, format_ok=False))  # no answer or reason
    assert (graded.format_ok, graded.answer, graded.reason) == (False, None, "")
    with pytest.raises(TypeError, match=r"\.score and \.correct"):
        as_reward_result(SimpleNamespace(score=0.5))  # says nothing of correctness


# ----------------------------------------------------------------------------- turns and hostile sizes


def test_each_turn_is_its_own_text():
    split = PolicyText(["<answer>\\boxed{4", "2}</answer>"])
    assert str(split) == "<answer>\\boxed{4\n2}</answer>"  # as one text it would read as an answer of 42
    assert check_format(split) == (False, None, "unbalanced <answer> tags in turn 1")
    assert arpo_reward(split, math("42"), NO_TOOLS).score == -1.0
    assert get_reward("math")(split, math("42"), NO_TOOLS).score == 0.0  # no answer in any one turn
    spanning = PolicyText(["<answer><search>q</search>", "\\boxed{42}</answer>"])
    assert arpo_reward(spanning, math("42"), {"search": 1}).score == -1.0
    assert get_reward("exact")(spanning, qa("42"), {"search": 1}).score == 0.0
    whole = PolicyText(["<think>x</think><search>q</search>", "<think>y</think><answer>\\boxed{42}</answer>"])
    assert check_format(whole) == (True, "42", "ok") and arpo_reward(whole, math("42"), {"search": 1}).score == 1.0
    assert pickle.loads(pickle.dumps(split)).turns == split.turns


@pytest.mark.parametrize(
    "response",
    [
        "<answer>" + "\\boxed{" * 20_000 + "</answer>",  # every box unclosed: each one was rescanned to the end
        "<answer>\\boxed{1}" + "\\boxed{" * 20_000 + "</answer>",
        "<answer>" * 20_000 + "\\boxed{1}",  # no closing tag: each opening was matched to the end
    ],
    ids=["unclosed boxes", "a closed box first", "unclosed answers"],
)
def test_reward_parsing_is_linear(response):
    t0 = time.perf_counter()
    for name in ("arpo", "math", "f1"):
        get_reward(name)(response, math("1"), NO_TOOLS)
    assert extract_boxed(response.replace("<answer>", "")) in (None, "1")
    assert time.perf_counter() - t0 < 2.0  # quadratic parsing took minutes here (0.8 s for 1,000 boxes, 13 s for 4,000)
