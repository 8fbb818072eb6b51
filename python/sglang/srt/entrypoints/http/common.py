"""What every router of the HTTP server shares: the API-key middleware, the error handlers that
turn exceptions into `{"error": {...}}` bodies, and reading a JSON body."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from sglang.srt.entrypoints.openai.utils import OpenAIError, error_response, from_error

logger = logging.getLogger(__name__)

UNAUTHENTICATED_PATHS = ("/health", "/metrics")


class ApiKeyMiddleware:
    """Require `Authorization: Bearer <api_key>` on every path except /health (pure ASGI)."""

    def __init__(self, app: Any, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"] not in UNAUTHENTICATED_PATHS:
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != self.expected:
                response = error_response("invalid or missing API key", 401, "AuthenticationError")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_json(request: Request) -> Any:
    body = await request.body()
    if not body:
        return {}
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise OpenAIError(f"malformed JSON body: {err}") from None


async def _openai_error(_request: Request, err: OpenAIError) -> JSONResponse:
    return from_error(err)


async def _validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
    return error_response(f"invalid request: {err.errors()[:3]}")


async def _internal_error(_request: Request, err: Exception) -> JSONResponse:
    logger.exception("request failed")
    return error_response(f"internal server error: {err}", 500, "InternalServerError")


def add_error_handlers(app: FastAPI) -> None:
    """OpenAIError -> its status and body; a bad request body -> 400; anything else -> 500."""
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
