"""The offline engine: `sgl.Engine(**server_args).generate(...)` without an HTTP server.

The TokenizerManager runs on a private event loop in a background thread; sync calls and calls
made from the caller's own event loop are bridged with `asyncio.run_coroutine_threadsafe`.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Union

from sglang.srt.disaggregation.role import DisaggregationRole
from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.entrypoints.launch import ChildProcesses, launch_processes
from sglang.srt.managers.io_struct import (
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReqOutput,
    SchedulerReadyInfo,
)
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.model_loader.hf_resolve import hub_id_of_snapshot, resolve_model_paths
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.process import configure_logger
from sglang.version import __version__

logger = logging.getLogger(__name__)


def _launch_subprocesses(
    server_args: ServerArgs, scheduler_entry: Optional[Callable[..., None]] = None
) -> tuple[TokenizerManager, SchedulerReadyInfo]:
    """Start scheduler + detokenizer and build the TokenizerManager (main process side).

    The child processes are kept on `tokenizer_manager.child_processes` (a `ChildProcesses`),
    which the caller must `terminate()` at shutdown.
    """
    port_args = PortArgs.init_new(server_args)
    bootstrap = None
    if DisaggregationRole.of(server_args).runs_bootstrap_server():
        from sglang.srt.disaggregation.bootstrap import BootstrapServer  # PD: the prefill ranks register here

        bootstrap = BootstrapServer(server_args.host, server_args.disaggregation_bootstrap_port).start()
    try:
        children, info, tokenizer = launch_processes(server_args, port_args, scheduler_entry)
    except BaseException:
        if bootstrap is not None:
            bootstrap.close()
        raise
    try:
        tokenizer_manager = TokenizerManager(server_args, port_args, info, tokenizer)
    except BaseException:
        children.terminate()
        raise
    tokenizer_manager.child_processes = children
    tokenizer_manager.pd_bootstrap_server = bootstrap
    return tokenizer_manager, info


def server_info(tokenizer_manager: TokenizerManager, state: GetInternalStateReqOutput) -> dict:
    """SGLang's /get_server_info payload: server args + scheduler info + internal states (one per
    attention-DP replica, as upstream lists one per DP rank)."""
    info = dataclasses.asdict(tokenizer_manager.server_args)
    for name in ("model_path", "tokenizer_path"):  # a Hub id as given, not its cache snapshot
        model_id = hub_id_of_snapshot(info[name])
        if model_id is not None and model_id == info["served_model_name"]:
            info[name] = model_id
    info.update(dataclasses.asdict(tokenizer_manager.scheduler_info))
    info["internal_states"] = state.replica_states or [state.state]
    info["num_unfinished_requests"] = tokenizer_manager.num_running  # the tokenizer manager's request table
    info["version"] = __version__
    return info


class Engine:
    """Offline inference engine; every ServerArgs field is a keyword argument."""

    def __init__(self, _scheduler_entry: Optional[Callable[..., None]] = None, **kwargs: Any):
        self.server_args = resolve_model_paths(ServerArgs.from_kwargs(**kwargs))  # HF ids: local dirs
        check_server_args(self.server_args)
        configure_logger(self.server_args.log_level, "Engine")
        self._shutdown_done = False
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(
            target=self.loop.run_forever, name="sglang-engine-loop", daemon=True
        )
        self.loop_thread.start()
        try:
            self.tokenizer_manager, self.scheduler_info = _launch_subprocesses(
                self.server_args, _scheduler_entry
            )
        except BaseException:
            self._stop_loop()
            raise
        self.children: ChildProcesses = self.tokenizer_manager.child_processes
        self.children.start_watchdog(self._on_child_death)
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ bridging
    def _on_child_death(self, message: str) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.tokenizer_manager.set_dead, message)
        self.children.terminate(grace_s=2.0)

    def _run(self, coro: Any) -> Any:
        """Run a coroutine on the engine loop and wait for it (from any thread but the loop's)."""
        if self._shutdown_done:
            coro.close()
            raise RuntimeError("the engine has been shut down")
        if threading.current_thread() is self.loop_thread:
            coro.close()
            raise RuntimeError("synchronous Engine calls cannot be made from the engine's own loop")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def _await(self, coro: Any) -> Any:
        """Await a coroutine that runs on the engine loop, from the caller's event loop."""
        if self._shutdown_done:
            coro.close()
            raise RuntimeError("the engine has been shut down")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    @staticmethod
    def _make_obj(
        prompt, sampling_params, input_ids, return_logprob, top_logprobs_num, stream, rid, **extra
    ) -> GenerateReqInput:
        return GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            rid=rid,
            stream=stream,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            **extra,  # upstream's other fields: logprob_start_len, token_ids_logprob, return_text_in_logprobs
        )

    async def _collect(self, obj: GenerateReqInput) -> Union[dict, list[dict]]:
        result = None
        async for out in self.tokenizer_manager.generate_request(obj):
            result = out
        return result

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: Optional[Union[str, list[str]]] = None,
        **extra: Any,
    ) -> Union[dict, list[dict], Iterator[dict]]:
        """Generate for one prompt (dict) or a batch (list); `stream=True` returns an iterator of chunks."""
        obj = self._make_obj(
            prompt, sampling_params, input_ids, return_logprob, top_logprobs_num, stream, rid, **extra
        )
        if not stream:
            return self._run(self._collect(obj))
        call = self._run(self.tokenizer_manager.submit(obj))
        agen = self.tokenizer_manager.iter_results(call)

        def iterate() -> Iterator[dict]:
            try:
                while True:
                    try:
                        yield self._run(agen.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                if not self._shutdown_done:
                    self._run(agen.aclose())  # aborts unfinished requests

        return iterate()

    async def async_generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: Optional[Union[str, list[str]]] = None,
        **extra: Any,
    ) -> Union[dict, list[dict], AsyncIterator[dict]]:
        """Like `generate`, awaitable; with `stream=True` it returns an async iterator of chunks."""
        obj = self._make_obj(
            prompt, sampling_params, input_ids, return_logprob, top_logprobs_num, stream, rid, **extra
        )
        if not stream:
            return await self._await(self._collect(obj))
        call = await self._await(self.tokenizer_manager.submit(obj))
        agen = self.tokenizer_manager.iter_results(call)

        async def iterate() -> AsyncIterator[dict]:
            try:
                while True:
                    try:
                        yield await self._await(agen.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                if not self._shutdown_done:
                    await self._await(agen.aclose())

        return iterate()

    # ------------------------------------------------------------------ control
    def abort_request(self, rid: str) -> None:
        self.loop.call_soon_threadsafe(self.tokenizer_manager.abort_request, rid)

    def flush_cache(self) -> FlushCacheReqOutput:
        return self._run(self.tokenizer_manager.flush_cache())

    def get_server_info(self) -> dict:
        state = self._run(self.tokenizer_manager.get_internal_state_reply())
        return server_info(self.tokenizer_manager, state)

    def shutdown(self) -> None:
        """Stop every child process and the engine loop (idempotent)."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        atexit.unregister(self.shutdown)
        self.children.terminate()
        self._stop_loop()

    def _stop_loop(self) -> None:
        tm = getattr(self, "tokenizer_manager", None)

        async def close() -> None:
            if tm is not None:
                tm.close()

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=5)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_shutdown_done", True):
                self.shutdown()
        except Exception:  # noqa: BLE001
            pass
