"""POST /v1/completions on top of the TokenizerManager."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sglang.srt.entrypoints.openai.protocol import (
    MAX_LOGPROBS,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, finish_fields, logprob_entries
from sglang.srt.entrypoints.openai.utils import OpenAIError, check_logprobs_num, check_model_name
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer.tokenizer_state import ReqChunk


def completion_logprobs(token_lps: list, top_lps: list, text_offset: int) -> CompletionLogprobs:
    """SGLang (logprob, id, text) entries -> OpenAI legacy completion logprobs."""
    out = CompletionLogprobs()
    offset = text_offset
    for i, (lp, _tid, text) in enumerate(token_lps):
        text = text or ""
        out.tokens.append(text)
        out.token_logprobs.append(lp)
        top = top_lps[i] if i < len(top_lps) else None
        out.top_logprobs.append(_top_dict(top) if top else None)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _top_dict(top: list) -> dict[str, float]:
    """{token text: logprob}; when two tokens share a text (e.g. partial UTF-8 bytes) keep the likelier."""
    out: dict[str, float] = {}
    for lp, _tid, text in top:
        out.setdefault(text or "", lp)
    return out


class OpenAIServingCompletion(OpenAIServingBase):
    request_cls = CompletionRequest
    response_cls = CompletionResponse
    stream_response_cls = CompletionStreamResponse
    id_prefix = "cmpl"

    def _build(self, req: CompletionRequest) -> GenerateReqInput:
        check_model_name(req.model, self.server_args.served_model_name, self.server_args.model_path)
        check_logprobs_num(req.logprobs, "logprobs", MAX_LOGPROBS)
        if req.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError("best_of is not supported (use n)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise OpenAIError("echo together with logprobs is not supported", param="echo")
        prompt = req.prompt
        if isinstance(prompt, list) and not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        text: Any = None
        input_ids: Any = None
        if isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str)):
            text = prompt
        else:
            input_ids = prompt
        return GenerateReqInput(
            text=text,
            input_ids=input_ids,
            sampling_params={**self.default_sampling, **req.base_sampling_params(req.max_tokens)},
            rid=req.rid,
            stream=req.stream,
            return_logprob=req.logprobs is not None,
            top_logprobs_num=req.logprobs or 0,
            return_text_in_logprobs=True,
            **req.bootstrap_fields(),  # PD disaggregation
        )

    def _echo_text(self, req: CompletionRequest, index: int) -> str:
        if not req.echo:
            return ""
        prompt = req.prompt
        i = index // max(req.n, 1)
        if isinstance(prompt, str):
            return prompt
        item = prompt[i]
        if isinstance(item, str):
            return item
        ids = item if isinstance(item, list) else prompt
        return self.tm.tokenizer.decode(ids) if self.tm.tokenizer is not None else ""

    def _choice(self, req: CompletionRequest, index: int, out: dict) -> BaseModel:
        echo = self._echo_text(req, index)
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(*logprob_entries(out), text_offset=len(echo))
        return CompletionChoice(index=index, text=echo + out["text"], logprobs=logprobs, **finish_fields(out))

    def _stream_choices(self, req: CompletionRequest, chunk: ReqChunk, first: bool) -> list[BaseModel]:
        """One choice with the new text (the echo before the first), logprobs and finish reason."""
        text = (self._echo_text(req, chunk.index) if first else "") + chunk.delta_text
        logprobs = None
        if req.logprobs is not None:
            # echo is refused with logprobs, so the offset is the generated text before this chunk
            offset = len(chunk.out["text"]) - len(chunk.delta_text)
            logprobs = completion_logprobs(
                *logprob_entries(chunk.out, chunk.logprob_start), text_offset=offset
            )
        finish = finish_fields(chunk.out)
        if not text and finish["finish_reason"] is None and logprobs is None:
            return []
        return [CompletionChoice(index=chunk.index, text=text, logprobs=logprobs, **finish)]
