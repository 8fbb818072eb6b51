"""HTTP server: SGLang's native API and the OpenAI-compatible API on FastAPI + uvicorn.

`create_app(tokenizer_manager)` builds the app (no module-level state); `launch_server(server_args)`
starts the child processes, serves until SIGINT/SIGTERM and stops every child on the way out.
If a child process dies the server stops its other children and exits non-zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from sglang.srt.entrypoints.engine import _launch_subprocesses, server_info
from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.utils import SSE_DONE, OpenAIError, error_body, error_response, from_error, sse
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_input import generate_req_from_dict
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.metrics.collector import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import configure_logger

logger = logging.getLogger(__name__)

HEALTH_GENERATE_TIMEOUT_S = 20.0
SHUTDOWN_RACE_S = 0.5
METRICS_STATE_TIMEOUT_S = 5.0  # a scrape waits at most this long for the scheduler's gauges
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


def print_banner(server_args: ServerArgs) -> None:
    """What a person starting the server needs: the URL, a curl line and an openai snippet."""
    url = server_args.url
    model = server_args.served_model_name
    auth = f' -H "Authorization: Bearer {server_args.api_key}"' if server_args.api_key else ""
    key = repr(server_args.api_key) if server_args.api_key else '"EMPTY"'
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    print(
        f"\nThe server is ready at {url}  (model: {model})\n\n"
        f"Try it with curl:\n"
        f"  curl {url}/v1/chat/completions -H \"Content-Type: application/json\"{auth} \\\n"
        f"    -d '{body}'\n\n"
        f"Or with the openai client:\n"
        f"  from openai import OpenAI\n"
        f"  client = OpenAI(base_url=\"{url}/v1\", api_key={key})\n"
        f"  r = client.chat.completions.create(model={model!r}, "
        f"messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}], max_tokens=32)\n"
        f"  print(r.choices[0].message.content)\n",
        flush=True,
    )


def create_app(tokenizer_manager: TokenizerManager, on_started: Optional[Callable[[], None]] = None) -> FastAPI:
    """The FastAPI app serving one TokenizerManager."""
    tm = tokenizer_manager
    args = tm.server_args
    completions = OpenAIServingCompletion(tm)
    chat = OpenAIServingChat(tm)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if on_started is not None:
            on_started()
        yield

    app = FastAPI(lifespan=lifespan)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request: Request, err: OpenAIError) -> JSONResponse:
        return from_error(err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(f"invalid request: {err.errors()[:3]}")

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, err: Exception) -> JSONResponse:
        logger.exception("request failed")
        return error_response(f"internal server error: {err}", 500, "InternalServerError")

    # ------------------------------------------------------------------ health and info
    @app.get("/health")
    async def health() -> Response:
        if tm.dead_message is not None:
            return PlainTextResponse(tm.dead_message, status_code=503)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0})
        if args.disaggregation_mode != "null":  # PD: a self-contained request (fake transfer backend)
            from sglang.srt.disaggregation.messages import fake_bootstrap

            obj = fake_bootstrap(obj)
        try:
            async def run() -> Any:
                async for out in tm.generate_request(obj):
                    return out

            await asyncio.wait_for(run(), timeout=HEALTH_GENERATE_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - any failure means unhealthy
            return PlainTextResponse(f"unhealthy: {err!r}", status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info() -> dict:
        return {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path,
            "served_model_name": args.served_model_name,
            "is_generation": True,
            "context_length": tm.scheduler_info.context_len,
            "vocab_size": tm.scheduler_info.vocab_size,
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> dict:
        return server_info(tm, await tm.get_internal_state())

    if tm.metrics is not None:

        @app.get("/metrics")
        async def metrics() -> Response:
            # Scheduler gauges are pulled at scrape time; on timeout the previous values stay.
            try:
                state = await asyncio.wait_for(tm.get_internal_state(), timeout=METRICS_STATE_TIMEOUT_S)
                tm.metrics.update_scheduler_state(state)
            except Exception as err:  # noqa: BLE001 - still serve the tokenizer-side metrics
                logger.warning("metrics: scheduler state unavailable (%r)", err)
            return Response(tm.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        out = await tm.flush_cache()
        if out.success:
            return PlainTextResponse("Cache flushed.\n", status_code=200)
        return error_response(f"cache flush failed: {out.message}", 400)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("rid", ""), str):
            raise OpenAIError("'rid' must be a string")
        tm.abort_request(body.get("rid", ""), abort_all=bool(body.get("abort_all", False)))
        return Response(status_code=200)

    # ------------------------------------------------------------------ native generate
    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_json(request)
        try:
            obj = generate_req_from_dict(body)
            call = await tm.submit(obj)
        except (TypeError, ValueError) as err:
            return error_response(str(err))
        if obj.stream:

            async def stream() -> AsyncIterator[str]:
                try:
                    async for out in tm.iter_results(call, request):
                        yield sse(out)
                except Exception as err:  # noqa: BLE001 - the stream has started: report in-band
                    logger.exception("generate stream failed")
                    yield sse(error_body(str(err), 500, "InternalServerError"))
                yield SSE_DONE

            return StreamingResponse(stream(), media_type="text/event-stream")
        result = None
        async for out in tm.iter_results(call, request):
            result = out
        if result is None:
            return error_response("client disconnected", 499, "ClientDisconnected")
        return JSONResponse(result)

    # ------------------------------------------------------------------ OpenAI
    @app.get("/v1/models")
    async def models() -> dict:
        card = ModelCard(id=args.served_model_name, root=args.model_path, max_model_len=tm.scheduler_info.context_len)
        return ModelList(data=[card]).model_dump()

    @app.post("/v1/completions")
    async def v1_completions(request: Request) -> Response:
        return await completions.handle(await read_json(request), request)

    @app.post("/v1/chat/completions")
    async def v1_chat_completions(request: Request) -> Response:
        return await chat.handle(await read_json(request), request)

    return app


def launch_server(server_args: ServerArgs, scheduler_entry: Optional[Callable[..., None]] = None) -> None:
    """Start the processes and serve HTTP until a signal; exits non-zero if a child process dies."""
    if server_args.node_rank > 0:
        from sglang.srt.entrypoints.launch import run_worker_node

        configure_logger(server_args.log_level, f"Node {server_args.node_rank}")
        run_worker_node(server_args)
        return
    configure_logger(server_args.log_level, "TokenizerManager")
    tm, _info = _launch_subprocesses(server_args, scheduler_entry)
    children = tm.child_processes

    def on_child_death(message: str) -> None:
        # A signal sent to the whole process group (e.g. by `timeout` or a service manager) stops
        # the children too: that is a shutdown in progress, not a crash.
        time.sleep(SHUTDOWN_RACE_S)
        if server is not None and server.should_exit:
            logger.info("%s during shutdown", message)
            return
        logger.error("a child process died (%s): shutting the server down", message.split(" process")[0])
        children.terminate(grace_s=2.0)
        sys.stderr.flush()
        os._exit(1)

    def on_sigterm(_sig: int, _frame: Any) -> None:
        raise SystemExit(0)

    children.start_watchdog(on_child_death)
    signal.signal(signal.SIGTERM, on_sigterm)
    server: Optional[uvicorn.Server] = None

    def on_started() -> None:
        async def wait_listening() -> None:
            while server is not None and not server.started:
                await asyncio.sleep(0.05)
            print_banner(server_args)

        asyncio.get_running_loop().create_task(wait_listening())

    try:
        app = create_app(tm, on_started=on_started)
        config = uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level=server_args.log_level,
            log_config=None,  # uvicorn's loggers propagate to ours (role-stamped lines)
            timeout_keep_alive=5,
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        server.run()
    finally:
        children.terminate()
