"""/tokenize and /detokenize (also under /v1/), in upstream SGLang's shapes:

    POST /tokenize    {"prompt": str | [str], "add_special_tokens": true}
                   -> {"tokens": [int] | [[int]], "count": int | [int], "max_model_len": int}
    POST /detokenize  {"tokens": [int] | [[int]], "skip_special_tokens": false}
                   -> {"text": str | [str]}

Both run in the HTTP process with the server's own tokenizer (no scheduler round trip)."""

from __future__ import annotations

from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.utils import OpenAIError, check_model_name, parse_model
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    prompt: Union[str, list[str]]
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    tokens: Union[list[int], list[list[int]]]
    skip_special_tokens: bool = False


class TokenRoutes:
    """Tokenize / detokenize with one TokenizerManager's tokenizer (`router()`)."""

    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tm = tokenizer_manager
        self.args = tokenizer_manager.server_args

    def router(self) -> APIRouter:
        router = APIRouter()
        for prefix in ("", "/v1"):
            router.add_api_route(f"{prefix}/tokenize", self.tokenize, methods=["POST"])
            router.add_api_route(f"{prefix}/detokenize", self.detokenize, methods=["POST"])
        return router

    def _tokenizer(self) -> Any:
        if self.tm.tokenizer is None:
            raise OpenAIError("this server has no tokenizer (started with --skip-tokenizer-init)")
        return self.tm.tokenizer

    def _check_model(self, model: Optional[str]) -> None:
        check_model_name(model, self.args.served_model_name, self.args.model_path)

    async def tokenize(self, request: Request) -> dict:
        req = parse_model(TokenizeRequest, await read_json(request))
        self._check_model(req.model)
        tok = self._tokenizer()

        def encode(text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=req.add_special_tokens))

        max_len = self.tm.scheduler_info.context_len
        if isinstance(req.prompt, str):
            ids = encode(req.prompt)
            return {"tokens": ids, "count": len(ids), "max_model_len": max_len}
        all_ids = [encode(p) for p in req.prompt]
        return {"tokens": all_ids, "count": [len(i) for i in all_ids], "max_model_len": max_len}

    async def detokenize(self, request: Request) -> dict:
        req = parse_model(DetokenizeRequest, await read_json(request))
        self._check_model(req.model)
        tok = self._tokenizer()
        vocab = self.tm.scheduler_info.vocab_size
        batch = bool(req.tokens) and isinstance(req.tokens[0], list)
        seqs = req.tokens if batch else [req.tokens]
        for seq in seqs:
            bad = [t for t in seq if not 0 <= t < max(vocab, len(tok))]
            if bad:
                raise OpenAIError(f"token ids {bad[:5]} are outside the vocabulary", param="tokens")
        texts = [tok.decode(seq, skip_special_tokens=req.skip_special_tokens) for seq in seqs]
        return {"text": texts if batch else texts[0]}
