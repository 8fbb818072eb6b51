"""Helpers shared by the OpenAI serving classes and the native HTTP routes: errors, SSE, usage."""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from sglang.srt.constrained.grammar_spec import KINDS, GrammarError, GrammarSpec, validate_spec
from sglang.srt.entrypoints.openai.protocol import ErrorBody, ErrorResponse, PromptTokensDetails, UsageInfo

SSE_DONE = "data: [DONE]\n\n"
ALWAYS_ACCEPTED_MODEL_NAMES = ("default",)


class OpenAIError(Exception):
    """An error to report to the client with an HTTP status and an OpenAI error type."""

    def __init__(
        self, message: str, status: int = 400, err_type: str = "BadRequestError", param: Optional[str] = None
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param


def error_body(
    message: str, status: int = 400, err_type: str = "BadRequestError", param: Optional[str] = None
) -> dict:
    return ErrorResponse(
        error=ErrorBody(message=message, type=err_type, param=param, code=status)
    ).model_dump()


def error_response(
    message: str, status: int = 400, err_type: str = "BadRequestError", param: Optional[str] = None
) -> JSONResponse:
    return JSONResponse(error_body(message, status, err_type, param), status_code=status)


def from_error(err: OpenAIError) -> JSONResponse:
    return error_response(err.message, err.status, err.err_type, err.param)


_STATUS_TYPES = {400: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}


def status_error_response(message: str, status: int) -> JSONResponse:
    """An error response whose OpenAI error type follows from the HTTP status."""
    return error_response(message, status, _STATUS_TYPES.get(status, "InternalServerError"))


def validation_message(err: ValidationError) -> str:
    """A short, readable summary of a pydantic ValidationError."""
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "invalid request: " + "; ".join(parts)


def parse_model(model_cls: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body into `model_cls`; raise OpenAIError(400) on bad input."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as err:
        raise OpenAIError(validation_message(err)) from None


def check_model_name(requested: Optional[str], served_model_name: str, model_path: str) -> None:
    """400 (as upstream SGLang answers) unless the model is the one served, its path, or omitted /
    SGLang's 'default'."""
    if not requested:
        return
    accepted = {
        served_model_name,
        model_path,
        model_path.rstrip("/").split("/")[-1],
        *ALWAYS_ACCEPTED_MODEL_NAMES,
    }
    if requested not in accepted:
        raise OpenAIError(
            f"The model `{requested}` does not exist. The served model name is `{served_model_name}`.",
            param="model",
        )


def constraint_field(req: Any) -> Optional[str]:
    """The request field that carries its constraint: `response_format` when not text, else the
    first of regex / json_schema / ebnf / structural_tag that is set (None: unconstrained)."""
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type != "text":
        return "response_format"
    return next((k for k in KINDS if getattr(req, k, None) is not None), None)


def check_constrained_decoding(req: Any, build: bool = True) -> None:
    """400 naming the field when a request's constraint (regex / JSON schema / EBNF grammar /
    structural tag, or a non-text `response_format`) is malformed, or more than one is given.
    `build`: also build its grammar with xgrammar here. The HTTP process passes False: importing
    xgrammar (and the torch it imports, ~2 s) on its event loop held back every stream it serves
    at the first constrained request; the scheduler builds the grammar and refuses an invalid one
    with the same 400 (`rejected_response` names the field)."""
    param = constraint_field(req)
    try:
        params = req.grammar_params()
        if len(params) > 1:
            raise GrammarError(f"only one constraint may be given, got {', '.join(sorted(params))}")
        if build:
            for kind, text in params.items():
                validate_spec(GrammarSpec(kind, text))
    except GrammarError as e:
        raise OpenAIError(str(e), param=param) from None


def rejected_response(req: Any, message: str, status: int) -> JSONResponse:
    """The error response of a request the scheduler refused. Its 400s are the grammars it could
    not build (`constrained/grammar_manager.grammar_error`): they name the constraint field."""
    param = constraint_field(req) if status == 400 else None
    if param is None:
        return status_error_response(message, status)
    return error_response(message, status, "BadRequestError", param)


def check_unsupported(req: Any) -> None:
    """400 naming the first upstream field set for a feature this server does not have
    (`SamplingExtensions.unsupported`)."""
    bad = req.unsupported()
    if bad is not None:
        name, what = bad
        raise OpenAIError(f"'{name}' ({what}) is not supported by this server", param=name)


def chunk_usage(out: dict) -> UsageInfo:
    """Usage of one request so far (stream_options.continuous_usage_stats)."""
    meta = out["meta_info"]
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def sse(data: Any) -> str:
    """One server-sent event (`data: <json>\\n\\n`)."""
    if isinstance(data, BaseModel):
        text = data.model_dump_json(exclude_none=True)
    else:
        text = json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"


def finish_reason_of(reason: Optional[dict]) -> tuple[Optional[str], Optional[Any]]:
    """SGLang finished_reason dict -> (OpenAI finish_reason, matched stop)."""
    if reason is None:
        return None, None
    kind = reason.get("type")
    if kind == "stop":
        return "stop", reason.get("matched")
    if kind == "length":
        return "length", None
    if kind == "abort":
        return "abort", None
    return str(kind), None


def make_usage(outs: list[dict], n: int) -> UsageInfo:
    """Usage over SGLang outputs ordered prompt-major (index = prompt * n + sample)."""
    prompt_tokens = 0
    cached_tokens = 0
    completion_tokens = 0
    for i, out in enumerate(outs):
        meta = out["meta_info"]
        if i % max(n, 1) == 0:
            prompt_tokens += meta["prompt_tokens"]
            cached_tokens += meta.get("cached_tokens", 0)
        completion_tokens += meta["completion_tokens"]
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def check_logprobs_num(value: Optional[int], name: str, limit: int) -> None:
    if value is not None and not 0 <= value <= limit:
        raise OpenAIError(f"{name} must be between 0 and {limit}, got {value}", param=name)
