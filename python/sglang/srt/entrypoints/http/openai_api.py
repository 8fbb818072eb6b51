"""The OpenAI-compatible routes: /v1/models, /v1/models/{model_id}, /v1/completions and
/v1/chat/completions (each endpoint's request flow is in `entrypoints/openai/`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.utils import error_response
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs


class OpenAIRoutes:
    """The /v1 API of one TokenizerManager (`router()` registers the routes)."""

    def __init__(self, tokenizer_manager: TokenizerManager, server_args: ServerArgs):
        self.tm = tokenizer_manager
        self.args = server_args
        self.completions = OpenAIServingCompletion(tokenizer_manager)
        self.chat = OpenAIServingChat(tokenizer_manager)

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/models", self.models, methods=["GET"])
        router.add_api_route("/v1/models/{model_id:path}", self.model, methods=["GET"])
        router.add_api_route("/v1/completions", self.v1_completions, methods=["POST"])
        router.add_api_route("/v1/chat/completions", self.v1_chat_completions, methods=["POST"])
        return router

    def _card(self) -> ModelCard:
        return ModelCard(
            id=self.args.served_model_name,
            root=self.args.model_path,
            max_model_len=self.tm.scheduler_info.context_len,
        )

    async def models(self) -> dict:
        return ModelList(data=[self._card()]).model_dump()

    async def model(self, model_id: str) -> Response:
        """The served model's card; any other id: 404 with OpenAI's error body."""
        if model_id != self.args.served_model_name:
            return error_response(
                f"The model '{model_id}' does not exist", 404, "NotFoundError", param="model"
            )
        return JSONResponse(self._card().model_dump())

    async def v1_completions(self, request: Request) -> Response:
        return await self.completions.handle(await read_json(request), request)

    async def v1_chat_completions(self, request: Request) -> Response:
        return await self.chat.handle(await read_json(request), request)
