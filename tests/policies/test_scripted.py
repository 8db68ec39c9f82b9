"""ScriptedPolicy: plays turns like a sampler (stop, eos, length, partial continuation)."""

import asyncio

from agentenv.envs.testing import build_test_tokenizer
from agentenv.policies.base import Policy
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.types import SamplingParams

TOK = build_test_tokenizer()
STOP = ("</search>", "</answer>")


def enc(text):
    return list(TOK.encode(text, add_special_tokens=False))


def run(coro):
    return asyncio.run(coro)


def test_protocol_and_turns_in_order():
    turns = ["<search>a</search>", "<answer>\\boxed{1}</answer>"]
    pol = ScriptedPolicy(TOK, turns)
    assert isinstance(pol, Policy)
    prompt = enc("question")
    g1 = run(pol.generate(prompt, SamplingParams(stop=STOP)))
    assert g1.token_ids == enc(turns[0]) and g1.finish_reason == "stop" and g1.stop_string == "</search>"
    assert g1.logprobs == [0.0] * len(g1.token_ids) and g1.entropies == [0.0] * len(g1.token_ids)
    ctx = prompt + g1.token_ids + enc("<result>\nx\n</result>")
    g2 = run(pol.generate(ctx, SamplingParams(stop=STOP)))
    assert g2.token_ids == enc(turns[1]) and g2.finish_reason == "stop"
    g3 = run(pol.generate(ctx + g2.token_ids, SamplingParams(stop=STOP)))
    assert g3.token_ids == [TOK.eos_token_id] and g3.finish_reason == "eos"
    assert g1.versions == [0] * len(g1.token_ids)
    pol.load_weights([])
    assert pol.weight_version == 1 and run(pol.generate(prompt, SamplingParams(stop=STOP))).versions[0] == 1


def test_eos_appended_when_no_stop():
    pol = ScriptedPolicy(TOK, ["just text"])
    g = run(pol.generate(enc("q"), SamplingParams(stop=STOP)))
    assert g.token_ids == enc("just text") + [TOK.eos_token_id] and g.finish_reason == "eos"
    g = run(pol.generate(enc("q"), SamplingParams(stop=STOP, include_eos=False)))
    assert g.token_ids == enc("just text") and g.finish_reason == "eos"


def test_length_cap_then_continue_partial():
    turn = "<think>a long careful thought about it</think><search>capital</search>"
    pol = ScriptedPolicy(TOK, [turn])
    prompt = enc("q")
    head = run(pol.generate(prompt, SamplingParams(max_tokens=4, stop=STOP)))
    assert head.finish_reason == "length" and head.token_ids == enc(turn)[:4]
    rest = run(pol.generate(prompt + head.token_ids, SamplingParams(stop=STOP)))
    assert head.token_ids + rest.token_ids == enc(turn) and rest.finish_reason == "stop"


def test_callable_script_sees_the_context():
    seen = []

    def script(ids):
        seen.append(list(ids))
        return f"<answer>\\boxed{{{len(ids)}}}</answer>"

    pol = ScriptedPolicy(TOK, script)
    g = run(pol.generate(enc("q"), SamplingParams(stop=STOP)))
    assert seen == [enc("q")] and TOK.decode(g.token_ids) == f"<answer>\\boxed{{{len(enc('q'))}}}</answer>"
