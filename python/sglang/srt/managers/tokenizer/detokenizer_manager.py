"""DetokenizerManager process: BatchTokenIDOut (scheduler) -> BatchStrOut (tokenizer manager).

Keeps one `RequestDetokState` per running rid, turns new token ids into new text incrementally
(no partial UTF-8 characters, stop strings held back while running and trimmed at the end) and
drops the state when the request finishes.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any, Optional, Sequence

import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut
from sglang.srt.managers.tokenizer.detok_tokenizer import BackendDecoder, DetokTokenizerSpec
from sglang.srt.managers.tokenizer.incremental_detok import RequestDetokState, find_anchor_ids
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.process import configure_logger, watch_parent

logger = logging.getLogger(__name__)


def load_tokenizer(server_args: ServerArgs, spec: Optional[DetokTokenizerSpec] = None) -> Optional[Any]:
    """The server's tokenizer, or None with --skip-tokenizer-init: rebuilt from the launcher's `spec`
    with `tokenizers` alone (no transformers, no torch), else loaded with transformers."""
    if server_args.skip_tokenizer_init:
        return None
    if spec is not None:
        return BackendDecoder(spec)
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)


class DetokenizerManager:
    """Turns token ids into incremental text, one state per running request."""

    def __init__(self, tokenizer: Optional[Any], anchor_ids: Optional[Sequence[int]] = None):
        """`anchor_ids`: `find_anchor_ids` of the tokenizer, when the launcher computed them."""
        self.tokenizer = tokenizer
        if anchor_ids is None:
            anchor_ids = find_anchor_ids(tokenizer) if tokenizer is not None else []
        self.anchor_ids = list(anchor_ids)
        self.states: dict[str, RequestDetokState] = {}

    def _state(self, out: BatchTokenIDOut, i: int) -> RequestDetokState:
        rid = out.rids[i]
        state = self.states.get(rid)
        if state is None:
            state = RequestDetokState(
                self.tokenizer,
                skip_special_tokens=out.skip_special_tokens[i],
                spaces_between_special_tokens=out.spaces_between_special_tokens[i],
                stop_strs=out.stop_strs[i] or [],
                no_stop_trim=out.no_stop_trim[i],
                anchor_ids=self.anchor_ids,
            )
            self.states[rid] = state
        return state

    def handle_batch(self, out: BatchTokenIDOut) -> BatchStrOut:
        """Decode one scheduler message; frees the state of finished requests."""
        texts: list[str] = []
        for i, rid in enumerate(out.rids):
            finished = out.finished_reasons[i]
            if self.tokenizer is None:
                texts.append("")
                continue
            try:
                texts.append(self._state(out, i).step(out.new_output_ids[i], finished))
            except Exception:  # noqa: BLE001 - one bad request must not kill the process
                logger.exception("detokenization failed for rid %s", rid)
                texts.append("")
            if finished is not None:
                self.states.pop(rid, None)
        return BatchStrOut(
            rids=list(out.rids),
            output_strs=texts,
            new_output_ids=out.new_output_ids,
            finished_reasons=out.finished_reasons,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            output_token_logprobs=out.output_token_logprobs,
            output_top_logprobs=out.output_top_logprobs,
            input_logprobs=out.input_logprobs,
            output_token_ids_logprobs=out.output_token_ids_logprobs,
        )


class DetokenizerProcess:
    """The ZMQ loop around a `DetokenizerManager`."""

    def __init__(self, manager: DetokenizerManager, port_args: PortArgs):
        self.manager = manager
        self.context = zmq.Context(2)
        self.recv_from_scheduler = self.context.socket(zmq.PULL)
        self.recv_from_scheduler.bind(port_args.detokenizer_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)

    def event_loop(self) -> None:
        while True:
            obj = self.recv_from_scheduler.recv_pyobj()
            if isinstance(obj, BatchTokenIDOut):
                self.send_to_tokenizer.send_pyobj(self.manager.handle_batch(obj))
            else:
                # Anything else is meant for the tokenizer manager: pass it on unchanged.
                self.send_to_tokenizer.send_pyobj(obj)


def run_detokenizer_process(
    server_args: ServerArgs, port_args: PortArgs, tokenizer_spec: Optional[DetokTokenizerSpec] = None
) -> None:
    """Process entry: load the tokenizer and serve forever; exit non-zero on failure.

    `tokenizer_spec` (from `detok_tokenizer_spec` in the launcher): decode with `tokenizers` alone."""
    configure_logger(server_args.log_level, "Detokenizer")
    watch_parent()
    try:
        anchor_ids = tokenizer_spec.anchor_ids if tokenizer_spec is not None else None
        manager = DetokenizerManager(load_tokenizer(server_args, tokenizer_spec), anchor_ids)
        process = DetokenizerProcess(manager, port_args)
        logger.info("detokenizer ready (pid %d)", os.getpid())
        process.event_loop()
    except KeyboardInterrupt:
        sys.exit(0)
    except Exception:  # noqa: BLE001
        logger.error("detokenizer failed:\n%s", traceback.format_exc())
        sys.exit(1)
