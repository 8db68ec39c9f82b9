"""AgentEnv: masks, context, limits, budgets, malformed calls, errors by fault, forks, determinism."""

import asyncio
import math

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from agentenv.envs.agent_env import AgentEnv, AgentEnvConfig
from agentenv.envs.testing import CounterTool, EchoTool, FailingTool, SleepTool, boxed_reward, make_task
from agentenv.errors import ConfigError, ToolError
from agentenv.tasks.prompts import render_prompt
from agentenv.types import Generation


def make_env(tok, tools=None, tasks=None, **cfg):
    tools = tools if tools is not None else [EchoTool("search"), CounterTool("python")]
    return AgentEnv(tools, tok, reward_fn=boxed_reward, config=AgentEnvConfig(**cfg), tasks=tasks)


def gen(ids, lp=-0.5, h=1.5, finish="stop"):
    return Generation(list(ids), [lp] * len(ids), [h] * len(ids), finish)


def check_context(env):
    traj = env.trajectory()
    assert env.context == [t for s in traj.segments for t in s.token_ids]
    assert traj.loss_mask == [1 if s.source == "policy" else 0 for s in traj.segments for _ in s.token_ids]


def test_reset_renders_the_prompt(tok, task):
    env = make_env(tok)
    obs, info = env.reset(seed=3, options={"task": task})
    prompt = render_prompt(tok, task.messages)
    assert obs.dtype == np.int64 and list(obs) == prompt == env.context
    assert info == {"task_id": "t0", "prompt_tokens": len(prompt)}
    assert env.stop_strings == ("</search>", "</python>", "</answer>")
    assert env.remaining_tokens == AgentEnvConfig().max_context_tokens - len(prompt)
    assert env.task is task and env.prompt_len == len(prompt)


def test_full_episode_masks_and_logprobs(tok, task, enc):
    env = make_env(tok)
    env.reset(options={"task": task})
    a1 = enc("<think>look</think><search>capital</search>")
    obs, r, term, trunc, info = env.step(gen(a1))
    assert tok.decode(obs) == "<result>\necho: capital\n</result>"
    assert (r, term, trunc) == (0.0, False, False)
    assert info["tool"] == "search" and info["tool_ok"] is True
    check_context(env)
    a2 = enc("<python>x</python>")
    obs, *_ = env.step(a2)  # raw ids: logprobs unknown
    assert tok.decode(obs) == "<result>\ncount=1\n</result>"
    obs, r, term, trunc, info = env.step(gen(enc("<answer>\\boxed{42}</answer>")))
    assert (r, term, trunc) == (1.0, True, False) and len(obs) == 0
    assert info["finish_reason"] == "answer" and info["reward"] == {"score": 1.0, "correct": True, "format_ok": True}
    check_context(env)
    traj = env.trajectory()
    assert [s.source for s in traj.segments] == ["prompt", "policy", "tool", "policy", "tool", "policy"]
    assert traj.segments[1].logprobs == [-0.5] * len(a1) and traj.segments[1].entropies == [1.5] * len(a1)
    assert all(math.isnan(x) for x in traj.segments[3].logprobs + traj.segments[3].entropies)
    assert traj.tool_calls == {"search": 1, "python": 1} and traj.num_tool_calls == 2
    assert traj.reward == 1.0 and traj.finish_reason == "answer" and traj.info["turns"] == 3
    assert traj.tool_time_s >= 0.0 and set(traj.info["tool_time_by_name"]) == {"search", "python"}


def test_eos_terminates_and_is_scored(tok, task, enc):
    env = make_env(tok)
    env.reset(options={"task": task})
    _, r, term, trunc, info = env.step(enc("I give up") + [tok.eos_token_id])
    assert term and not trunc and info["finish_reason"] == "eos"
    assert r == -1.0 and info["reward"]["format_ok"] is False  # no answer: format wrong


def test_eos_finish_without_eos_token(tok, task, enc):
    env = make_env(tok)
    env.reset(options={"task": task})
    _, _, term, _, info = env.step(gen(enc("done"), finish="eos"))
    assert term and info["finish_reason"] == "eos"


def test_unfinished_turn_truncates_with_length(tok, task, enc):
    env = make_env(tok)
    env.reset(options={"task": task})
    _, r, term, trunc, info = env.step(gen(enc("<think>I am still thin"), finish="length"))
    assert trunc and not term and info["finish_reason"] == "length" and r == -1.0


@pytest.mark.parametrize(
    "turn,needle",
    [
        ("<python>print(1)", "Unclosed tag: <python>"),
        ("<search>  </search>", "Empty query"),
        ("<calculator>2+2</calculator>", "Unknown tag <calculator>. Available tools: <search>, <python>"),
    ],
)
def test_malformed_calls_get_readable_results(tok, task, enc, turn, needle):
    env = make_env(tok)
    env.reset(options={"task": task})
    obs, r, term, trunc, info = env.step(enc(turn))
    text = tok.decode(obs)
    assert text.startswith("<result>\nError: ") and needle in text and text.endswith("</result>")
    assert (r, term, trunc) == (0.0, False, False) and info["tool"] == "invalid"
    assert env.trajectory().tool_calls == {"invalid": 1}
    check_context(env)


def test_tool_call_limit(tok, task, enc):
    echo = EchoTool("search")
    env = make_env(tok, tools=[echo], max_tool_calls=2)
    env.reset(options={"task": task})
    call = enc("<search>q</search>")
    env.step(call)
    env.step(call)
    obs, r, term, trunc, info = env.step(call)
    assert "Tool-call limit reached: 2 of 2" in tok.decode(obs) and "<answer>" in tok.decode(obs)
    assert not (term or trunc) and len(echo.calls) == 2  # the tool was not called
    _, r, term, trunc, info = env.step(call)  # ignored the warning: the episode ends
    assert trunc and info["finish_reason"] == "tool_limit" and len(echo.calls) == 2
    traj = env.trajectory()
    assert traj.tool_calls == {"search": 2, "invalid": 2} and traj.num_tool_calls == 2


def test_long_result_truncated_to_max_result_tokens(tok, task, enc):
    env = make_env(tok, tools=[EchoTool("search", repeat=200)], max_result_tokens=40)
    env.reset(options={"task": task})
    obs, _, _, _, info = env.step(enc("<search>capital</search>"))
    assert len(obs) == 40 and info["result_truncated"] is True
    assert tok.decode(obs).endswith("...[truncated]\n</result>")
    check_context(env)


def test_context_budget(tok, task, enc):
    prompt_len = len(render_prompt(tok, task.messages))
    call = enc("<search>capital</search>")
    limit = prompt_len + len(call) + 30
    env = make_env(tok, tools=[EchoTool("search", repeat=200)], max_context_tokens=limit, max_result_tokens=50)
    env.reset(options={"task": task})
    obs, _, term, trunc, info = env.step(call)
    # The result was cut to what the context leaves (30 tokens), then the context is full.
    assert len(obs) == 30 and len(env.context) == limit and env.remaining_tokens == 0
    assert trunc and not term and info["finish_reason"] == "context" and info["result_truncated"]
    check_context(env)


def test_turn_filling_the_context_truncates(tok, task, enc):
    prompt_len = len(render_prompt(tok, task.messages))
    turn = enc("<think>a long thought</think><search>q</search>")
    env = make_env(tok, max_context_tokens=prompt_len + len(turn), max_result_tokens=4)
    env.reset(options={"task": task})
    _, _, _, trunc, info = env.step(turn)
    assert trunc and info["finish_reason"] == "context" and env.trajectory().tool_calls == {}


def test_a_turn_beyond_the_context_budget_is_refused(tok, task, enc):
    """A policy must generate within `remaining_tokens`; a longer action is a caller's bug, refused before any change."""
    prompt_len = len(render_prompt(tok, task.messages))
    env = make_env(tok, max_context_tokens=prompt_len + 5, max_result_tokens=4)
    env.reset(options={"task": task})
    with pytest.raises(ValueError, match=r"has \d+ tokens but only 5 remain .*max_context_tokens"):
        env.step(enc("<think>a long thought that does not fit</think><search>q</search>"))
    assert env.context == render_prompt(tok, task.messages) and not env.done  # nothing was appended


@pytest.mark.parametrize(
    "action",
    [[1.7, 2.2], np.array([3.0, 4.0]), [[5, 6], [7, 8]], np.array([[5, 6]]), [True, False], ["5", "6"]],
    ids=["floats", "float-array", "nested", "2-D array", "bools", "strings"],
)
def test_float_or_nested_actions_are_refused(tok, task, action):
    env = make_env(tok)
    env.reset(options={"task": task})
    with pytest.raises(ValueError, match="flat sequence of token ids|must be integers"):
        env.step(action)
    assert env.context == render_prompt(tok, task.messages)


def test_prompt_too_long_is_a_config_error(tok, task):
    env = make_env(tok, max_context_tokens=10, max_result_tokens=4)
    with pytest.raises(ConfigError, match="max_context_tokens"):
        env.reset(options={"task": task})


def test_tool_timeout_becomes_a_result(tok, task, enc):
    env = make_env(tok, tools=[SleepTool("sleep", 5.0)], tool_timeout_s=0.05)
    env.reset(options={"task": task})
    obs, _, term, trunc, info = env.step(enc("<sleep>x</sleep>"))
    assert "timed out after 0.05 s" in tok.decode(obs) and not (term or trunc) and info["tool_ok"] is False


def test_tool_error_propagates(tok, task, enc):
    env = make_env(tok, tools=[FailingTool("search")])
    env.reset(options={"task": task})
    with pytest.raises(ToolError, match="unreachable"):
        env.step(enc("<search>x</search>"))


def test_order_errors(tok, task, enc):
    env = make_env(tok)
    with pytest.raises(ResetNeeded, match="before reset"):
        env.step(enc("<answer>\\boxed{1}</answer>"))
    env.reset(options={"task": task})
    env.step(enc("<answer>\\boxed{1}</answer>"))
    with pytest.raises(ResetNeeded, match="after the episode ended"):
        env.step(enc("<answer>\\boxed{1}</answer>"))
    with pytest.raises(ValueError, match="outside"):
        env.reset(options={"task": task})
        env.step([10**6])
    with pytest.raises(ValueError, match="needs a task"):
        make_env(tok).reset()


async def test_sync_step_inside_a_loop_points_to_astep(tok, task, enc):
    env = make_env(tok)
    env.reset(options={"task": task})
    with pytest.raises(RuntimeError, match="astep"):
        env.step(enc("<answer>\\boxed{42}</answer>"))
    _, r, term, _, _ = await env.astep(enc("<answer>\\boxed{42}</answer>"))
    assert term and r == 1.0


def test_fork_is_independent_both_ways(tok, task, enc):
    proto = CounterTool("python")
    env = make_env(tok, tools=[EchoTool("search"), proto])
    env.reset(options={"task": task})
    env.step(enc("<python>a</python>"))
    before = (env.context, env.trajectory().tool_calls)
    child = env.fork()
    assert child.context == before[0] and child.episode_tools["python"] is not env.episode_tools["python"]
    obs_child, *_ = child.step(enc("<python>b</python>"))
    assert tok.decode(obs_child) == "<result>\ncount=2\n</result>"  # the fork kept the session's state
    assert (env.context, env.trajectory().tool_calls) == before and env.episode_tools["python"].count == 1
    child_ctx = child.context
    env.step(enc("<search>z</search>"))
    assert child.context == child_ctx and child.trajectory().tool_calls == {"python": 2}
    ctraj = child.trajectory()
    assert ctraj.parent_uid == env.trajectory().uid and ctraj.branch_token == len(before[0])
    child.close()
    assert child_ctx and not env.episode_tools["python"].closed  # closing the fork leaves the parent's tool open
    env.close()


def test_tool_lifecycle(tok, task, enc):
    proto = CounterTool("python")
    env = make_env(tok, tools=[proto])
    env.reset(options={"task": task})
    ep_tool = env.episode_tools["python"]
    assert ep_tool is not proto and proto.forks == [ep_tool]
    env.step(enc("<python>a</python>"))
    assert proto.count == 0 and ep_tool.count == 1  # the prototype keeps an empty state
    env.reset(options={"task": task})  # the old episode's tool is closed, a fresh fork is made
    assert ep_tool.closed and env.episode_tools["python"].count == 0
    asyncio.run(env.aclose())
    assert all(t.closed for t in proto.forks) and not proto.closed
    with pytest.raises(ResetNeeded, match="closed"):
        env.step(enc("<python>a</python>"))
    env.close()
    assert not proto.closed  # not owned
    owned = AgentEnv([proto], tok, reward_fn=boxed_reward, owns_tools=True)
    owned.close()
    owned.close()  # idempotent
    assert proto.closed


def test_same_seed_same_episode_and_task_draw(tok, enc):
    tasks = [make_task(task_id=f"t{i}", answer=str(i)) for i in range(20)]
    actions = [enc("<python>a</python>"), enc("<search>b</search>"), enc("<answer>\\boxed{3}</answer>")]

    def play(seed):
        env = make_env(tok, tasks=tasks)
        obs, info = env.reset(seed=seed)
        out = [info["task_id"], list(obs)]
        for a in actions:
            o, r, term, trunc, _ = env.step(a)
            out.append((list(o), r, term, trunc))
        traj = env.trajectory()
        return out, traj.token_ids, traj.loss_mask

    assert play(7) == play(7)
    assert {play(s)[0][0] for s in range(8)} != {"t0"}  # the seed picks the task


def test_gymnasium_check_env(tok):
    env = make_env(tok, tasks=[make_task(), make_task(task_id="t1", answer="1")])
    check_env(env, skip_render_check=True)
    assert isinstance(env.observation_space, gymnasium.spaces.Sequence)
    sample = env.action_space.sample()
    assert sample.dtype == np.int64 and sample[-1] == tok.eos_token_id and sample in env.action_space
    env.close()


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"max_tool_calls": -1}, "env.max_tool_calls"),
        ({"max_context_tokens": 1}, "env.max_context_tokens"),
        ({"max_result_tokens": 4096}, "env.max_result_tokens"),
        ({"tool_timeout_s": 0}, "env.tool_timeout_s"),
        ({"result_template": "<r></r>"}, "env.result_template"),
    ],
)
def test_config_validation(kwargs, key):
    with pytest.raises(ConfigError) as e:
        AgentEnvConfig(**kwargs)
    assert e.value.key == key


def test_config_from_mapping_and_bad_tools(tok):
    assert AgentEnv([], tok, config={"max_tool_calls": 6}).config.max_tool_calls == 6
    with pytest.raises(ConfigError, match=r"env\.max_calls: unknown key .*did you mean 'max_tool_calls'"):
        AgentEnv([], tok, config={"max_calls": 6})
    with pytest.raises(ConfigError, match="two tools"):
        AgentEnv([EchoTool("search"), EchoTool("search")], tok)
    with pytest.raises(ConfigError, match="reserved"):
        AgentEnv([EchoTool("answer")], tok)
    with pytest.raises(ConfigError, match="cannot be a tag"):
        AgentEnv([EchoTool("my tool")], tok)
    with pytest.raises(ConfigError, match=r"env\.tools: str is not a Tool: it needs a name"):
        AgentEnv(["search"], tok)


def test_no_room_for_a_result_ends_without_calling(tok, task, enc):
    prompt_len = len(render_prompt(tok, task.messages))
    call = enc("<search>capital</search>")
    echo = EchoTool("search")
    env = make_env(tok, tools=[echo], max_context_tokens=prompt_len + len(call) + 5, max_result_tokens=4)
    env.reset(options={"task": task})
    obs, _, _, trunc, info = env.step(call)
    assert trunc and info["finish_reason"] == "context" and len(obs) == 0 and echo.calls == []
    assert env.trajectory().segments[-1].source == "policy"


def test_default_reward_is_arpo(tok, task, enc):
    env = AgentEnv([EchoTool("search")], tok)
    env.reset(options={"task": task})
    _, r, term, _, info = env.step(enc("<think>6*7</think><answer>\\boxed{42}</answer>"))
    assert term and r == 1.0 and info["reward"]["correct"] and info["reward"]["format_ok"]
    env.reset(options={"task": task})
    _, r, *_ = env.step(enc("<think>6*7</think>42") + [tok.eos_token_id])
    assert r == -1.0


def test_tool_call_format_is_a_registered_part(tok, task, enc):
    from agentenv.envs.formats import TOOL_FORMATS, TagFormat, register_tool_format
    from agentenv.envs.results import ResultFormatter

    class ObsFormat(TagFormat):
        """Tags for calls, results shown as <obs>...</obs> whatever the env's template."""

        def result_formatter(self, tokenizer, template, marker):
            return ResultFormatter(tokenizer, "<obs>{text}</obs>", marker)

    register_tool_format("test_obs", ObsFormat, overwrite=True)
    assert "tags" in TOOL_FORMATS.registered()
    env = AgentEnv([EchoTool("search")], tok, reward_fn=boxed_reward, config={"tool_format": "test_obs"})
    env.reset(seed=0, options={"task": task})
    obs, *_ = env.step(enc("<search>hi</search>"))
    assert tok.decode(obs) == "<obs>echo: hi</obs>" and env.stop_strings == ("</search>", "</answer>")
    with pytest.raises(ConfigError, match=r"env\.tool_format: unknown tool-call format 'tagz'\. Did you mean 'tags'"):
        AgentEnv([], tok, config={"tool_format": "tagz"})


def test_the_reward_reads_no_tool_text_whatever_the_format(tok, task, enc):
    from agentenv.envs.formats import TagFormat, register_tool_format
    from agentenv.envs.results import ResultFormatter

    class AnswerInResults(TagFormat):
        """A format whose every result holds a correct, well-formed answer."""

        def result_formatter(self, tokenizer, template, marker):
            return ResultFormatter(tokenizer, "<answer>\\boxed{42}</answer>{text}", marker)

    register_tool_format("test_answer_in_results", AnswerInResults, overwrite=True)
    env = AgentEnv([EchoTool("search")], tok, config={"tool_format": "test_answer_in_results"})
    env.reset(options={"task": task})
    obs, *_ = env.step(enc("<search>hi</search>"))
    assert "<answer>\\boxed{42}</answer>" in tok.decode(obs)
    _, r, term, _, info = env.step([tok.eos_token_id])
    assert term and r == -1.0 and not info["reward"]["correct"] and not info["reward"]["format_ok"]
    assert env.policy_text() == "<search>hi</search>\n"  # its turns only, each decoded alone
