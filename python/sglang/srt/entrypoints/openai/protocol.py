"""OpenAI-compatible request/response models (pydantic v2) for /v1/completions and /v1/chat/completions.

Requests accept OpenAI's fields plus SGLang's sampling extensions (top_k, min_p,
repetition_penalty, stop_token_ids, stop_regex, ...). Every field of upstream SGLang's protocol is
declared here: honoured, or refused with a 400 naming it when it asks for something this server
does not do (`UNSUPPORTED_FIELDS`: LoRA, sessions, hidden states, custom logit processors,
priorities, reasoning effort). Constrained decoding (SGLang's regex, json_schema, ebnf,
structural_tag and OpenAI's response_format) becomes the native sampling parameters
(`grammar_params`, constrained/grammar_spec.py). Fields that are
not upstream's are ignored, as OpenAI-compatible servers do; wrong types are rejected by pydantic
(-> HTTP 400).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Generic, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from sglang.srt.constrained.grammar_spec import KINDS, as_text, response_format_params

MAX_LOGPROBS = 20

LogprobsT = TypeVar("LogprobsT")
ChoiceT = TypeVar("ChoiceT")


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------- errors and shared
class ErrorBody(BaseModel):
    message: str
    type: str = "BadRequestError"
    param: Optional[str] = None
    code: int = 400


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class StreamOptions(BaseModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class ChoiceBase(BaseModel, Generic[LogprobsT]):
    """Fields of every choice (both endpoints, response and stream chunk)."""

    index: int
    logprobs: Optional[LogprobsT] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class ResponseBase(BaseModel, Generic[ChoiceT]):
    """Envelope of every response and stream chunk; subclasses set `object` and the choice type."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChoiceT]
    usage: Optional[UsageInfo] = None


class SamplingExtensions(BaseModel):
    """Sampling fields shared by both endpoints (OpenAI's and SGLang's extras)."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    seed: Optional[int] = None
    user: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None
    # SGLang extensions
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    rid: Optional[str] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    # SGLang's constrained decoding (`grammar_params`; invalid ones: 400, `utils.check_constrained_decoding`)
    regex: Optional[Any] = None
    json_schema: Optional[Any] = None
    ebnf: Optional[Any] = None
    structural_tag: Optional[Any] = None
    response_format: Optional[ResponseFormat] = None
    # Upstream's fields for features this server does not have: refused when set (UNSUPPORTED_FIELDS)
    lora_path: Optional[Any] = None
    session_id: Optional[Any] = None
    session_params: Optional[Any] = None
    return_hidden_states: Optional[Any] = None
    return_routed_experts: Optional[bool] = None
    routed_experts_start_len: Optional[int] = None  # only with return_routed_experts (refused)
    return_cached_tokens_details: Optional[bool] = None
    return_token_ids: Optional[bool] = None
    custom_logit_processor: Optional[Any] = None
    custom_params: Optional[Any] = None
    custom_labels: Optional[Any] = None
    priority: Optional[int] = None
    extra_key: Optional[Any] = None
    cache_salt: Optional[Any] = None
    ngram_corpus_id: Optional[Any] = None
    routed_dp_rank: Optional[int] = None
    data_parallel_rank: Optional[int] = None
    disagg_prefill_dp_rank: Optional[int] = None
    images_config: Optional[Any] = None
    # PD disaggregation: added by sglang-router (passed to the generate call as they are)
    bootstrap_host: Optional[Union[str, list[str]]] = None
    bootstrap_port: Optional[Union[int, list[int]]] = None
    bootstrap_room: Optional[Union[int, list[int]]] = None

    def bootstrap_fields(self) -> dict[str, Any]:
        return {
            "bootstrap_host": self.bootstrap_host,
            "bootstrap_port": self.bootstrap_port,
            "bootstrap_room": self.bootstrap_room,
        }

    def base_sampling_params(self, max_new_tokens: Optional[int]) -> dict[str, Any]:
        """SGLang native sampling params for this request (None values mean 'default')."""
        params = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "no_stop_trim": self.no_stop_trim,
            "n": self.n,
            "seed": self.seed,
            "logit_bias": self.logit_bias,
            # an empty list (upstream's clients send one when unused) means none
            "stop_regex": self.stop_regex or None,
            **self.grammar_params(),
        }
        return {k: v for k, v in params.items() if v is not None}

    def grammar_params(self) -> dict[str, str]:
        """The native constraint of this request: the top-level regex / json_schema / ebnf /
        structural_tag, or the response_format's (GrammarError, a ValueError, when malformed)."""
        params = {k: as_text(k, getattr(self, k)) for k in KINDS if getattr(self, k) is not None}
        return {**params, **response_format_params(self.response_format)}

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(field, what it asks for) of the first upstream field set that this server cannot honour."""
        for name, what in UNSUPPORTED_FIELDS.items():
            value = getattr(self, name, None)
            if not (value is None or value is False or (isinstance(value, (str, list, dict)) and not value)):
                return name, what
        return None


UNSUPPORTED_FIELDS = {
    "lora_path": "LoRA adapters",
    "session_id": "sessions",
    "session_params": "sessions",
    "return_hidden_states": "returning hidden states",
    "return_routed_experts": "returning routed experts",
    "return_cached_tokens_details": "cache tier details",
    "return_token_ids": "returning token ids in choices",
    "return_prompt_token_ids": "returning prompt token ids in choices",
    "return_meta_info": "returning meta info in choices",
    "custom_logit_processor": "custom logit processors",
    "custom_params": "custom logit processor parameters",
    "custom_labels": "custom metric labels",
    "priority": "priority scheduling",
    "extra_key": "request classification keys",
    "cache_salt": "cache salts",
    "ngram_corpus_id": "n-gram speculative decoding",
    "routed_dp_rank": "routing to a chosen DP rank (the server picks the replica)",
    "data_parallel_rank": "routing to a chosen DP rank (the server picks the replica)",
    "disagg_prefill_dp_rank": "routing to a chosen prefill DP rank",
    "images_config": "multimodal inputs",
    "max_dynamic_patch": "multimodal inputs",
    "min_dynamic_patch": "multimodal inputs",
    "use_audio_in_video": "multimodal inputs",
}


# ---------------------------------------------------------------------------- completions
class CompletionRequest(SamplingExtensions):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(ChoiceBase[CompletionLogprobs]):
    text: str


class CompletionResponse(ResponseBase[CompletionChoice]):
    object: str = "text_completion"


class CompletionStreamResponse(CompletionResponse):
    """One SSE chunk of /v1/completions (same shape as the full response)."""


# ---------------------------------------------------------------------------- chat
class ChatContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[str, list[ChatContentPart]]] = None
    name: Optional[str] = None
    # the history of a tool-using conversation: passed to the chat template as message fields
    tool_calls: Optional[list[dict[str, Any]]] = None  # assistant
    tool_call_id: Optional[str] = None  # tool
    reasoning_content: Optional[str] = None  # assistant


class ChatCompletionRequest(SamplingExtensions):
    messages: list[ChatMessage]
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    # tool calling (checked by `chat_tools.check_tools`, 400 naming the field when malformed)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None  # false: at most one call
    chat_template_kwargs: Optional[dict[str, Any]] = None
    # render the last (assistant) message open, without a generation prompt: the model continues it
    continue_final_message: bool = False
    # with --reasoning-parser (upstream's switches, default on): reasoning_content split from the
    # content; streamed as it is written, or in one delta once the reasoning ends
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    # as upstream: sets the templates' thinking switches (`thinking` / `enable_thinking`, "none" off)
    reasoning_effort: Optional[Union[str, float]] = None
    reasoning: Optional[dict[str, Any]] = None  # {"effort": ..., "enabled": ...}
    task: Optional[str] = None  # upstream: DeepSeek-V4's encoder only, ignored otherwise; so here
    input_ids: Optional[list[int]] = None  # the prompt's ids: no chat template
    return_prompt_token_ids: Optional[bool] = None
    return_meta_info: Optional[bool] = None
    max_dynamic_patch: Optional[int] = None
    min_dynamic_patch: Optional[int] = None
    use_audio_in_video: Optional[bool] = None
    # a streamed request's output parsers, one per choice index (chat_output.ChatOutputParsers)
    _parsers: Any = PrivateAttr(default=None)

    def thinking(self) -> Optional[bool]:
        """The thinking switch `reasoning_effort` / `reasoning` ask for (None: not asked)."""
        effort = self.reasoning_effort
        reasoning = self.reasoning or {}
        if effort is None:
            effort = reasoning.get("effort", reasoning.get("reasoning_effort"))
        if effort is not None:
            return effort != "none"
        enabled = reasoning.get("enabled", reasoning.get("enable"))
        return True if enabled else None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None  # JSON text (a stream's fragments concatenate to it)


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(BaseModel):
    """A streamed piece of a call: the first with id, type and name, then argument fragments."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChatCompletionChoice(ChoiceBase[ChoiceLogprobs]):
    message: ChatResponseMessage


class ChatCompletionResponse(ResponseBase[ChatCompletionChoice]):
    object: str = "chat.completion"


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None


class ChatCompletionStreamChoice(ChoiceBase[ChoiceLogprobs]):
    delta: DeltaMessage


class ChatCompletionStreamResponse(ResponseBase[ChatCompletionStreamChoice]):
    object: str = "chat.completion.chunk"
