"""What /v1/chat/completions makes of a choice's text with `--reasoning-parser` and tools:
`reasoning_content`, `content` and `tool_calls`, for a finished output (`ChoiceOutput.message`)
or delta by delta while it streams (`ChoiceOutput.deltas`, then `finish`).

The reasoning section is split off first (when the server has a reasoning parser, the request
keeps `separate_reasoning` and its chat-template switches let the model reason); the calls are
then found in what follows it: by `--tool-call-parser` for `tool_choice` "auto", as the JSON array
of calls the constraint allows for a forced `tool_choice`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.entrypoints.openai.chat_tools import tool_mode
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatResponseMessage,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from sglang.srt.function_call import JsonArrayDetector, ToolCallDetector, ToolCallItem, make_detector
from sglang.srt.reasoning_parser import ReasoningDetector, make_reasoning_detector


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class OutputParsing:
    """How one request's outputs are parsed (from the server's parsers and the request)."""

    reasoning_parser: Optional[str]
    tool_parser: Optional[str]  # a --tool-call-parser name, "json_array" (forced), or None
    tools: Optional[list[dict[str, Any]]]
    stream_reasoning: bool
    chat_template_kwargs: dict[str, Any]
    single_call: bool  # parallel_tool_calls false: the first call only

    @classmethod
    def of(
        cls,
        req: ChatCompletionRequest,
        reasoning_parser: Optional[str],
        tool_call_parser: Optional[str],
        chat_template_kwargs: dict[str, Any],
    ) -> "OutputParsing":
        mode = tool_mode(req)
        tool_parser = {"none": None, "auto": tool_call_parser, "forced": "json_array"}[mode]
        return cls(
            reasoning_parser=reasoning_parser if req.separate_reasoning else None,
            tool_parser=tool_parser,
            tools=req.tools,
            stream_reasoning=req.stream_reasoning,
            chat_template_kwargs=chat_template_kwargs,
            single_call=req.parallel_tool_calls is False,
        )

    @property
    def active(self) -> bool:
        return self.reasoning_parser is not None or self.tool_parser is not None


class ChoiceOutput:
    """The parsers of one choice (one output): fresh streaming state for each."""

    def __init__(self, parsing: OutputParsing):
        self.parsing = parsing
        self.reasoning: Optional[ReasoningDetector] = None
        if parsing.reasoning_parser is not None:
            self.reasoning = make_reasoning_detector(
                parsing.reasoning_parser, parsing.stream_reasoning, parsing.chat_template_kwargs
            )
        self.tools: Optional[ToolCallDetector] = None
        if parsing.tool_parser == "json_array":
            self.tools = JsonArrayDetector()
        elif parsing.tool_parser is not None:
            self.tools = make_detector(parsing.tool_parser)
        self._ids: dict[int, str] = {}  # streamed call index -> its id

    @property
    def made_calls(self) -> bool:
        return bool(self._ids)

    # ------------------------------------------------------------------ a finished output
    def message(self, text: str) -> ChatResponseMessage:
        reasoning = None
        if self.reasoning is not None:
            split = self.reasoning.detect_and_parse(text)
            reasoning, text = split.reasoning_text or None, split.normal_text
        # all reasoning (the section never ended): no content (null, as OpenAI's)
        plain = ChatResponseMessage(
            content=text or (None if reasoning else text), reasoning_content=reasoning
        )
        if self.tools is None:
            return plain
        parsed = self.tools.detect_and_parse(text, self.parsing.tools)
        calls = parsed.calls[:1] if self.parsing.single_call else parsed.calls
        if not calls:
            return plain
        for call in calls:
            self._ids[call.tool_index] = tool_call_id()
        tool_calls = [
            ToolCall(id=self._ids[c.tool_index], function=FunctionCall(name=c.name, arguments=c.parameters))
            for c in calls
        ]
        return ChatResponseMessage(
            content=parsed.normal_text or None, reasoning_content=reasoning, tool_calls=tool_calls
        )

    # ------------------------------------------------------------------ streaming
    def deltas(self, text: str) -> tuple[DeltaMessage, list[DeltaMessage]]:
        """(the text delta: reasoning and content, the call deltas) for the next piece of the output."""
        reasoning, content = "", text
        if self.reasoning is not None:
            split = self.reasoning.parse_streaming_increment(text)
            reasoning, content = split.reasoning_text, split.normal_text
        calls: list[ToolCallItem] = []
        if self.tools is not None and content:
            parsed = self.tools.parse_streaming_increment(content, self.parsing.tools)
            content, calls = parsed.normal_text, parsed.calls
        return _text_delta(reasoning, content), self._call_deltas(calls)

    def finish(self) -> DeltaMessage:
        """What the parsers still hold at the end of the output (text held back, delayed reasoning)."""
        reasoning, content = "", ""
        if self.reasoning is not None:
            rest = self.reasoning.flush()
            reasoning, content = rest.reasoning_text, rest.normal_text
        if self.tools is not None:
            if content:
                parsed = self.tools.parse_streaming_increment(content, self.parsing.tools)
                content = parsed.normal_text  # calls cannot complete in what was held back
            content += self.tools.flush()
        return _text_delta(reasoning, content)

    def _call_deltas(self, calls: list[ToolCallItem]) -> list[DeltaMessage]:
        out = []
        for item in calls:
            if self.parsing.single_call and item.tool_index > 0:
                continue
            if item.name is not None:
                self._ids[item.tool_index] = tool_call_id()
                call = DeltaToolCall(
                    index=item.tool_index,
                    id=self._ids[item.tool_index],
                    type="function",
                    function=FunctionCall(name=item.name, arguments=""),
                )
            else:
                call = DeltaToolCall(index=item.tool_index, function=FunctionCall(arguments=item.parameters))
            out.append(DeltaMessage(tool_calls=[call]))
        return out


def _text_delta(reasoning: str, content: str) -> DeltaMessage:
    return DeltaMessage(reasoning_content=reasoning or None, content=content or None)


class ChatOutputParsers:
    """A streamed request's `ChoiceOutput`s, one per choice index, made on first use."""

    def __init__(self, parsing: OutputParsing):
        self.parsing = parsing
        self._choices: dict[int, ChoiceOutput] = {}

    def __getitem__(self, index: int) -> ChoiceOutput:
        if index not in self._choices:
            self._choices[index] = ChoiceOutput(self.parsing)
        return self._choices[index]
