"""parse_turn: ARPO's tag format, first complete call wins, readable reasons for malformed calls."""

from agentenv.envs.parsing import parse_turn

TOOLS = ("search", "python")


def test_call_and_query_stripped():
    p = parse_turn("<think>find it</think><search>  capital of Norvex </search>", TOOLS)
    assert (p.kind, p.tool, p.query) == ("call", "search", "capital of Norvex")
    assert p.end == len("<think>find it</think><search>  capital of Norvex </search>")


def test_tag_names_come_from_the_tools():
    assert parse_turn("<browse>http://x</browse>", TOOLS).kind == "malformed"
    p = parse_turn("<browse>http://x</browse>", ("browse",))
    assert (p.kind, p.tool, p.query) == ("call", "browse", "http://x")


def test_multiline_python_code_kept_verbatim_inside():
    code = "x = 3\nfor i in range(2):\n    x *= 2\nprint(x)"
    p = parse_turn(f"<python>\n{code}\n</python>", TOOLS)
    assert p.kind == "call" and p.query == code


def test_answer():
    p = parse_turn("<think>ok</think><answer>The answer is \\boxed{7}</answer>", TOOLS)
    assert (p.kind, p.answer) == ("answer", "The answer is \\boxed{7}")


def test_nothing():
    assert parse_turn("<think>still thinking", TOOLS).kind == "none"
    assert parse_turn("", TOOLS).kind == "none"
    assert parse_turn("<think>a</think> plain text", TOOLS).kind == "none"


def test_first_complete_call_wins():
    p = parse_turn("<python>1+1</python><search>b</search>", TOOLS)
    assert (p.tool, p.query) == ("python", "1+1")
    p = parse_turn("<search>a</search><answer>\\boxed{1}</answer>", TOOLS)
    assert p.kind == "call"
    p = parse_turn("<answer>\\boxed{1}</answer><search>a</search>", TOOLS)
    assert p.kind == "answer"


def test_tag_mentioned_earlier_does_not_swallow_the_call():
    p = parse_turn("<think>I will use <search> now</think><search>real query</search>", TOOLS)
    assert (p.kind, p.query) == ("call", "real query")


def test_unclosed_tag():
    p = parse_turn("<think>x</think><python>print(1)", TOOLS)
    assert p.kind == "malformed" and p.tool == "python"
    assert "Unclosed" in p.error and "</python>" in p.error
    p = parse_turn("<answer>\\boxed{3}", TOOLS)
    assert p.kind == "malformed" and "</answer>" in p.error


def test_empty_query():
    p = parse_turn("<search>   </search>", TOOLS)
    assert p.kind == "malformed" and p.tool == "search" and "Empty query" in p.error


def test_unknown_tag_lists_the_tools():
    p = parse_turn("<think>hm</think><calculator>2+2</calculator>", TOOLS)
    assert p.kind == "malformed" and p.tool == "calculator"
    assert "Unknown tag <calculator>" in p.error
    assert "<search>" in p.error and "<python>" in p.error


def test_reserved_tags_are_not_unknown():
    assert parse_turn("<think>a</think><result>b</result>", TOOLS).kind == "none"


def test_unknown_tag_in_thinking_does_not_block_a_call():
    p = parse_turn("<think>use <b>bold</b></think><search>q</search>", TOOLS)
    assert (p.kind, p.query) == ("call", "q")


def test_closing_tag_without_opening():
    p = parse_turn("capital of Norvex</search>", TOOLS)
    assert p.kind == "malformed" and "</search>" in p.error and "<search>" in p.error


def test_no_tools_message():
    p = parse_turn("<search>x</search>", ())
    assert p.kind == "malformed" and "answer with <answer>" in p.error
