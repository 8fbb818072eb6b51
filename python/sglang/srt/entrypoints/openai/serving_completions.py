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


def _with_prompt(out: dict, token_lps: list, top_lps: list, echo: bool) -> tuple[list, list]:
    """With echo, the prompt's entries (input_token_logprobs, first logprob null) before the
    generated ones; top lists padded so that they stay aligned with the tokens."""
    if not echo:
        return token_lps, top_lps
    meta = out["meta_info"]
    prompt = meta.get("input_token_logprobs") or []
    prompt_top = list(meta.get("input_top_logprobs") or [])
    prompt_top += [None] * (len(prompt) - len(prompt_top))
    top = list(top_lps) + [None] * (len(token_lps) - len(top_lps))
    return prompt + token_lps, prompt_top + top


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
            # echo + logprobs (lm-eval's loglikelihood): the prompt's logprobs too, the first one null
            logprob_start_len=0 if req.echo and req.logprobs is not None else -1,
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
            token_lps, top_lps = _with_prompt(out, *logprob_entries(out), req.echo)
            logprobs = completion_logprobs(token_lps, top_lps, text_offset=0 if req.echo else len(echo))
        return CompletionChoice(index=index, text=echo + out["text"], logprobs=logprobs, **finish_fields(out))

    def _stream_choices(self, req: CompletionRequest, chunk: ReqChunk, first: bool) -> list[BaseModel]:
        """One choice with the new text (the echo before the first), logprobs and finish reason."""
        text = (self._echo_text(req, chunk.index) if first else "") + chunk.delta_text
        logprobs = None
        if req.logprobs is not None:
            # the offset of the generated text before this chunk (after the echoed prompt)
            offset = len(chunk.out["text"]) - len(chunk.delta_text)
            offset += len(self._echo_text(req, chunk.index)) if req.echo else 0
            token_lps, top_lps = logprob_entries(chunk.out, chunk.logprob_start)
            if req.echo and first:  # the echoed prompt's tokens come first, from offset 0
                token_lps, top_lps = _with_prompt(chunk.out, token_lps, top_lps, True)
                offset = 0
            logprobs = completion_logprobs(token_lps, top_lps, text_offset=offset)
        finish = finish_fields(chunk.out)
        if not text and finish["finish_reason"] is None and logprobs is None:
            return []
        return [CompletionChoice(index=chunk.index, text=text, logprobs=logprobs, **finish)]
