"""Upstream's /v1 fields without a server: each is honoured (what reaches the chat template or the
sampling params) or refused by name."""

from __future__ import annotations

import pytest

from sglang.srt.entrypoints.openai.protocol import (
    UNSUPPORTED_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from sglang.srt.entrypoints.openai.chat_tools import check_tools
from sglang.srt.entrypoints.openai.serving_chat import (
    message_dicts,
    template_flags,
    template_kwargs,
)
from sglang.srt.entrypoints.openai.utils import OpenAIError, check_unsupported

USER = {"role": "user", "content": "hi"}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [USER], **fields})


def test_tool_history_fields_reach_the_template() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    req = chat(
        messages=[
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "why"},
            {"role": "tool", "tool_call_id": "c1", "content": "42", "name": "f"},
        ]
    )
    msgs = message_dicts(req)
    assert msgs[1]["tool_calls"] == [{**call, "function": {"name": "f", "arguments": {"x": 1}}}]
    assert msgs[1]["reasoning_content"] == "why" and msgs[1]["content"] == ""
    assert msgs[2] == {"role": "tool", "content": "42", "name": "f", "tool_call_id": "c1"}
    bad = chat(
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [{**call, "function": {"name": "f", "arguments": "{"}}]},
        ]
    )
    with pytest.raises(OpenAIError, match="arguments"):
        message_dicts(bad)


def test_continue_final_message_flags() -> None:
    assert template_flags(chat()) == {"add_generation_prompt": True}
    req = chat(messages=[USER, {"role": "assistant", "content": "Sure"}], continue_final_message=True)
    assert template_flags(req) == {"add_generation_prompt": False, "continue_final_message": True}
    with pytest.raises(OpenAIError) as err:
        template_flags(chat(continue_final_message=True))
    assert err.value.param == "continue_final_message"


def test_reasoning_effort_sets_the_thinking_switches() -> None:
    assert template_kwargs(chat()) == {}
    assert template_kwargs(chat(reasoning_effort="none")) == {"thinking": False, "enable_thinking": False}
    assert template_kwargs(chat(reasoning_effort="high")) == {"thinking": True, "enable_thinking": True}
    assert template_kwargs(chat(reasoning={"enabled": True}))["enable_thinking"] is True
    own = chat(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False})
    assert template_kwargs(own) == {"enable_thinking": False, "thinking": True}


def test_tool_choice_without_tools() -> None:
    for choice in (None, "none", "auto"):
        check_tools(chat(tool_choice=choice))
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(OpenAIError) as err:
            check_tools(chat(tool_choice=choice))
        assert err.value.param == "tool_choice"
    check_tools(chat(tools=[{"type": "function", "function": {"name": "f"}}]))  # tools are served
    with pytest.raises(OpenAIError) as err:
        check_tools(chat(tools=[{"type": "function", "function": {"nam": "f"}}]))
    assert err.value.param == "tools"
    with pytest.raises(OpenAIError):
        check_tools(chat(messages=[{"role": "system", "content": "s", "tools": [{"x": 1}]}, USER]))


def test_stop_regex_goes_to_the_sampling_params() -> None:
    assert "stop_regex" not in chat(stop_regex=[]).base_sampling_params(None)
    assert chat(stop_regex=[r"\d"]).base_sampling_params(None)["stop_regex"] == [r"\d"]
    comp = CompletionRequest.model_validate({"prompt": "x", "stop_regex": "a+"})
    assert comp.base_sampling_params(4)["stop_regex"] == "a+"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_FIELDS))
def test_unsupported_fields_are_refused_by_name(name: str) -> None:
    value = 0 if "rank" in name else ("x" if name in ("lora_path", "cache_salt", "extra_key") else True)
    if name in ("session_params", "custom_params", "images_config", "custom_labels"):
        value = {"k": "v"}
    if name in ("max_dynamic_patch", "min_dynamic_patch", "priority", "ngram_corpus_id", "session_id"):
        value = 1 if "patch" in name or name == "priority" else "c"
    req = chat(**{name: value})
    with pytest.raises(OpenAIError) as err:
        check_unsupported(req)
    assert err.value.param == name and name in err.value.message
    check_unsupported(chat(**{name: None}))  # unset: accepted


def test_upstream_defaults_are_accepted() -> None:
    """What upstream's clients send when a feature is unused."""
    req = chat(
        separate_reasoning=True,
        stream_reasoning=True,
        return_hidden_states=False,
        routed_experts_start_len=0,
        lora_path=None,
        session_params={},
        parallel_tool_calls=True,
        tool_choice="none",
        task="title",
    )
    check_unsupported(req)
    check_tools(req)
