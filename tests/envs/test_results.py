"""Result formatting: template, token budget, truncation marker, no special-token injection."""

import pytest

from agentenv.envs.results import ResultFormatter, call_tool, result_text, validate_result_fields
from agentenv.envs.testing import SleepTool
from agentenv.errors import ConfigError
from agentenv.types import ToolResult


def test_fits_unchanged(tok):
    f = ResultFormatter(tok)
    ids, cut = f.encode("Page 1: Norvex", budget=100)
    assert not cut
    assert tok.decode(ids) == "<result>\nPage 1: Norvex\n</result>"


def test_cut_to_budget_with_marker(tok):
    f = ResultFormatter(tok)
    text = "the capital of Norvex is Quenby " * 50
    ids, cut = f.encode(text, budget=30)
    assert cut and len(ids) == 30
    out = tok.decode(ids)
    assert out.startswith("<result>\nthe capital") and out.endswith("...[truncated]\n</result>")


def test_budget_below_frame_gives_nothing(tok):
    f = ResultFormatter(tok)
    assert f.encode("x" * 100, budget=f.min_tokens - 1) == ([], True)
    ids, cut = f.encode("x" * 100, budget=f.min_tokens)
    assert cut and len(ids) == f.min_tokens


def test_tool_text_cannot_inject_eos(tok):
    ids, _ = ResultFormatter(tok).encode("a <|im_end|> b", budget=100)
    assert tok.eos_token_id not in ids
    # The model reads the string, broken by a zero-width space, never the token.
    assert tok.decode(ids) == "<result>\na <\u200b|im_end|> b\n</result>"


def test_result_tokens_are_the_frame_tokenized_whole():
    """Pieces tokenized apart can merge differently at their seams (the tiny model's tokenizer merges the
    template's newline with a text's leading ones); the frame is tokenized as one text."""
    from agentenv.toy.tiny import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    f = ResultFormatter(tok)
    for text, budget in [("\n\nleading newlines", 100), ("the capital of Norvex is Quenby.\n\n" * 20, 25)]:
        ids, cut = f.encode(text, budget)
        assert len(ids) <= budget and cut == (budget < 100)
        assert ids == list(tok.encode(tok.decode(ids), add_special_tokens=False))


def test_template_may_hold_special_tokens(tok):
    f = ResultFormatter(tok, template="<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    ids, _ = f.encode("hi", budget=100)
    assert ids.count(tok.eos_token_id) == 2


def test_result_text():
    assert result_text(ToolResult(text="out")) == "out"
    assert result_text(ToolResult(text="", ok=False, error="bad code")) == "Error: bad code"
    assert result_text(ToolResult(text="Traceback...", ok=False, error="exit 1")) == "Traceback..."


@pytest.mark.parametrize(
    "args,key",
    [
        (("env", "no placeholder", "", 10, 1.0), "env.result_template"),
        (("env", "{text}{text}", "", 10, 1.0), "env.result_template"),
        (("env", "{text}", "", 0, 1.0), "env.max_result_tokens"),
        (("env", "{text}", "", 10, 0), "env.tool_timeout_s"),
    ],
)
def test_validation_names_the_key(args, key):
    with pytest.raises(ConfigError) as e:
        validate_result_fields(*args)
    assert e.value.key == key


async def test_timeout_becomes_a_result():
    res, elapsed = await call_tool(SleepTool("sleep", 5.0), "x", timeout_s=0.05)
    assert not res.ok and res.error == "timeout" and "timed out after 0.05 s" in res.text
    assert elapsed < 1.0
