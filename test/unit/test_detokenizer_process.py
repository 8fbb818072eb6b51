"""The detokenizer process started by `launch_processes` decodes without importing torch.

It gets the launcher's tokenizer as a `DetokTokenizerSpec` and decodes with `tokenizers` alone
(detok_tokenizer.py). The engine's real launch path runs here with a stand-in scheduler rank that
only reports ready (no model), the test sends the detokenizer a `BatchTokenIDOut` as a scheduler
would and reads its `BatchStrOut`, then looks at the process's memory maps: torch's libraries are
not loaded, the `tokenizers` extension is. Top-level imports are kept light: the stand-in rank
imports this module.
"""

from __future__ import annotations

import os
import time

import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut, SchedulerReadyInfo

TEXT = "<|im_start|>user\nHéllo 世界 🙂 naïve<|im_end|>\n"


def ready_scheduler(server_args, port_args, rank, pipe_writer) -> None:
    """A scheduler rank that reports ready and waits to be terminated."""
    pipe_writer.send({"status": "ready", "info": SchedulerReadyInfo(4096, 4096, 4096, 512, 8)})
    time.sleep(600)


def _batch(ids: list[int]) -> BatchTokenIDOut:
    """Two requests with the same ids, special tokens skipped and kept; both finish now."""
    n = 2
    return BatchTokenIDOut(
        rids=["skip", "keep"],
        new_output_ids=[list(ids), list(ids)],
        finished_reasons=[{"type": "length", "length": len(ids)}] * n,
        prompt_tokens=[1] * n,
        completion_tokens=[len(ids)] * n,
        cached_tokens=[0] * n,
        skip_special_tokens=[True, False],
        spaces_between_special_tokens=[True, True],
        no_stop_trim=[False] * n,
        stop_strs=[[]] * n,
        output_token_logprobs=[None] * n,
        output_top_logprobs=[None] * n,
    )


def test_detokenizer_process_decodes_without_torch():
    from sglang.srt.entrypoints.launch import launch_processes
    from sglang.srt.port_args import PortArgs
    from sglang.srt.server_args import ServerArgs
    from sglang.test.tiny_models import TINY_LLAMA_DIR

    server_args = ServerArgs(model_path=TINY_LLAMA_DIR, load_format="dummy", log_level="warning")
    port_args = PortArgs.init_new(server_args)
    ctx = zmq.Context()
    from_detok = ctx.socket(zmq.PULL)
    from_detok.bind(port_args.tokenizer_ipc_name)
    children, _info, tokenizer = launch_processes(server_args, port_args, scheduler_entry=ready_scheduler)
    try:
        to_detok = ctx.socket(zmq.PUSH)
        to_detok.connect(port_args.detokenizer_ipc_name)
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        to_detok.send_pyobj(_batch(ids))
        assert from_detok.poll(120_000), "no answer from the detokenizer process"
        out = from_detok.recv_pyobj()
        assert isinstance(out, BatchStrOut) and out.rids == ["skip", "keep"]
        assert out.output_strs == [
            tokenizer.decode(ids, skip_special_tokens=True),
            tokenizer.decode(ids, skip_special_tokens=False),
        ]
        assert out.output_strs[1] == TEXT
        (detok,) = [proc for name, proc in children.procs if name == "Detokenizer"]
        with open(f"/proc/{detok.pid}/maps") as f:
            libraries = {os.path.basename(line.split()[-1]) for line in f if "/" in line}
        assert any(lib.startswith("tokenizers") for lib in libraries), sorted(libraries)
        assert not [lib for lib in libraries if "torch" in lib], sorted(libraries)
    finally:
        children.terminate(grace_s=2.0)
        ctx.destroy(linger=0)
