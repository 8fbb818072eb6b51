"""HTTP server: SGLang's native API and the OpenAI-compatible API on FastAPI + uvicorn.

`create_app(tokenizer_manager)` assembles the app from the routers of `entrypoints/http/` (no
module-level state); `launch_server(server_args)` starts the child processes, serves until
SIGINT/SIGTERM and stops every child on the way out.
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
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from sglang.srt import envs
from sglang.srt.entrypoints.engine import _launch_subprocesses
from sglang.srt.entrypoints.http.admin import AdminRoutes
from sglang.srt.entrypoints.http.common import ApiKeyMiddleware, add_error_handlers
from sglang.srt.entrypoints.http.native import NativeRoutes
from sglang.srt.entrypoints.http.openai_api import OpenAIRoutes
from sglang.srt.entrypoints.http.parsers import ParserRoutes
from sglang.srt.entrypoints.http.tokens import TokenRoutes
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import configure_logger

logger = logging.getLogger(__name__)

SHUTDOWN_RACE_S = 0.5
FAIL_PENDING_S = 0.3  # a dying server's loop gets this long to send its pending requests their error
READY_LINE = "The server is fired up and ready to roll!"  # upstream's; scripts wait for it


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
        f'  curl {url}/v1/chat/completions -H "Content-Type: application/json"{auth} \\\n'
        f"    -d '{body}'\n\n"
        f"Or with the openai client:\n"
        f"  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{url}/v1", api_key={key})\n'
        f"  r = client.chat.completions.create(model={model!r}, "
        f'messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32)\n'
        f"  print(r.choices[0].message.content)\n",
        flush=True,
    )


def create_app(
    tokenizer_manager: TokenizerManager, on_started: Optional[Callable[[], None]] = None
) -> FastAPI:
    """The FastAPI app serving one TokenizerManager: the native, OpenAI and admin routers, the
    error handlers and, with --api-key, the key check."""
    tm = tokenizer_manager
    args = tm.server_args

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        tm.start()  # read the scheduler's heartbeats from the start, not from the first request
        if on_started is not None:
            on_started()
        yield

    app = FastAPI(lifespan=lifespan)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    # CORS as upstream: any origin, method and header (added last: outermost, so a preflight is
    # answered before the API-key check, which browsers never send on OPTIONS)
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"], allow_headers=["*"]
    )
    add_error_handlers(app)
    app.include_router(NativeRoutes(tm, args).router())
    app.include_router(AdminRoutes(tm).router())
    app.include_router(OpenAIRoutes(tm, args).router())
    app.include_router(TokenRoutes(tm).router())
    app.include_router(ParserRoutes(args).router())
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
        loop = tm.loop
        if loop is not None and not loop.is_closed():
            # pending requests end with an error that says why (streams in-band, others a 500)
            loop.call_soon_threadsafe(tm.set_dead, message)
            time.sleep(FAIL_PENDING_S)
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
            logger.info(READY_LINE)

        asyncio.get_running_loop().create_task(wait_listening())

    try:
        app = create_app(tm, on_started=on_started)
        config = uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level=server_args.log_level,
            log_config=None,  # uvicorn's loggers propagate to ours (role-stamped lines)
            timeout_keep_alive=envs.SGLANG_TIMEOUT_KEEP_ALIVE.get(),
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        server.run()
    finally:
        children.terminate()
