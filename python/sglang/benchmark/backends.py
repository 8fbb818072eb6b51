"""Streaming request functions of bench_serving, one per backend, over aiohttp.

- `sglang`: SGLang's native `POST /generate` (cumulative text; `meta_info.completion_tokens`);
- `openai`: `POST /v1/completions` (any OpenAI-compatible server, vLLM's included);
- `openai-chat`: `POST /v1/chat/completions` (the prompt is one user message).

Timing: TTFT = request sent -> first chunk carrying output; ITL = gaps between later chunks that
carry output (a native chunk that brought k tokens adds k equal gaps); latency = request sent ->
end of the stream. All requests ask for greedy decoding and, unless disabled, `ignore_eos` so
every request generates exactly its output length.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import aiohttp

BACKEND_ALIASES = {
    "sglang": "sglang",
    "sglang-native": "sglang",
    "openai": "openai",
    "sglang-oai": "openai",
    "vllm": "openai",
    "openai-chat": "openai-chat",
    "sglang-oai-chat": "openai-chat",
    "vllm-chat": "openai-chat",
}
ENDPOINTS = {"sglang": "/generate", "openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
REQUEST_TIMEOUT_S = 6 * 3600


@dataclass
class RequestFuncInput:
    prompt: str
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    ignore_eos: bool = True
    extra_request_body: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)


@dataclass
class RequestFuncOutput:
    success: bool = False
    generated_text: str = ""
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_len: int = 0  # tokens the server reported (0: unknown, count by re-tokenizing)
    error: str = ""
    start_time: float = 0.0  # perf_counter at send


RequestFunc = Callable[[RequestFuncInput, aiohttp.ClientSession], Awaitable[RequestFuncOutput]]


def resolve_backend(name: str) -> str:
    if name not in BACKEND_ALIASES:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_ALIASES)})")
    return BACKEND_ALIASES[name]


def new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S), connector=aiohttp.TCPConnector(limit=0)
    )


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """JSON payloads of a `text/event-stream` response, until `data: [DONE]`."""
    buffer = b""
    async for piece in response.content.iter_any():  # no per-line size limit
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


def _error_of(event: dict) -> Optional[str]:
    err = event.get("error")
    if err is None:
        return None
    return err.get("message", str(err)) if isinstance(err, dict) else str(err)


class _Timer:
    """Collects TTFT / ITL for one request as output chunks arrive."""

    def __init__(self, out: RequestFuncOutput):
        self.out = out
        self.last = out.start_time

    def chunk(self, num_tokens: int = 1) -> None:
        now = time.perf_counter()
        if self.out.ttft == 0.0:
            self.out.ttft = now - self.out.start_time
        elif num_tokens > 0:
            gap = (now - self.last) / num_tokens
            self.out.itl.extend([gap] * num_tokens)
        self.last = now


async def _run(
    body: dict,
    inp: RequestFuncInput,
    session: aiohttp.ClientSession,
    on_event: Callable[[dict, _Timer], None],
) -> RequestFuncOutput:
    out = RequestFuncOutput(prompt_len=inp.prompt_len)
    out.start_time = time.perf_counter()
    timer = _Timer(out)
    try:
        async with session.post(inp.api_url, json=body, headers=inp.headers) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}: {(await response.text())[:500]}"
                return out
            async for event in sse_events(response):
                error = _error_of(event)
                if error is not None:
                    out.error = error
                    return out
                on_event(event, timer)
        out.latency = time.perf_counter() - out.start_time
        out.success = out.ttft > 0.0 or inp.output_len == 0
        if not out.success:
            out.error = "the stream carried no output"
    except Exception as err:  # noqa: BLE001 - a failed request is a result, not a crash
        out.error = f"{type(err).__name__}: {err}"
    return out


async def request_sglang(inp: RequestFuncInput, session: aiohttp.ClientSession) -> RequestFuncOutput:
    body = {
        "text": inp.prompt,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": inp.output_len,
            "ignore_eos": inp.ignore_eos,
        },
        "stream": True,
        **inp.extra_request_body,
    }
    seen = {"tokens": 0}
    state: dict[str, Any] = {}

    def on_event(event: dict, timer: _Timer) -> None:
        meta = event.get("meta_info") or {}
        tokens = int(meta.get("completion_tokens", seen["tokens"]))
        if tokens > seen["tokens"]:
            timer.chunk(tokens - seen["tokens"])
            seen["tokens"] = tokens
        state["text"] = event.get("text", state.get("text", ""))

    out = await _run(body, inp, session, on_event)
    out.generated_text = state.get("text", "")
    out.output_len = seen["tokens"]
    return out


def _openai_body(inp: RequestFuncInput) -> dict:
    body = {
        "model": inp.model,
        "temperature": 0.0,
        "max_tokens": inp.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if inp.ignore_eos:
        body["ignore_eos"] = True
    return body


def _openai_request(chat: bool) -> RequestFunc:
    async def request(inp: RequestFuncInput, session: aiohttp.ClientSession) -> RequestFuncOutput:
        body = _openai_body(inp)
        if chat:
            body["messages"] = [{"role": "user", "content": inp.prompt}]
        else:
            body["prompt"] = inp.prompt
        body.update(inp.extra_request_body)
        parts: list[str] = []
        usage: dict[str, Any] = {}

        def on_event(event: dict, timer: _Timer) -> None:
            if event.get("usage"):
                usage.update(event["usage"])
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if text:
                    timer.chunk()
                    parts.append(text)

        out = await _run(body, inp, session, on_event)
        out.generated_text = "".join(parts)
        out.output_len = int(usage.get("completion_tokens") or 0)
        return out

    return request


REQUEST_FUNCS: dict[str, RequestFunc] = {
    "sglang": request_sglang,
    "openai": _openai_request(chat=False),
    "openai-chat": _openai_request(chat=True),
}
