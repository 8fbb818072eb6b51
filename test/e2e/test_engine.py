"""Offline `sgl.Engine` end to end: generate (single, batch, input_ids, stream), async_generate,
context manager, shutdown leaving no child process, and a dead scheduler failing requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

import sglang as sgl
from sglang.srt.managers.tokenizer.incremental_detok import decode_ids
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from server_helpers import TINY_LLAMA, pid_alive, wait_until

pytestmark = pytest.mark.slow  # starts its own servers / engines

ENGINE_KW = dict(model_path=TINY_LLAMA, load_format="dummy", dtype="float32", log_level="warning")
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(**ENGINE_KW)
    yield eng
    eng.shutdown()


def test_generate_single(engine):
    out = engine.generate("Hello", {"max_new_tokens": 5, **GREEDY})
    assert isinstance(out, dict)
    assert len(out["output_ids"]) == 5
    assert out["text"] == decode_ids(get_tokenizer(TINY_LLAMA), out["output_ids"], True, True)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_generate_batch_and_input_ids(engine):
    outs = engine.generate(["Hello", "World", "Again"], {"max_new_tokens": 3, **GREEDY})
    assert isinstance(outs, list) and len(outs) == 3
    assert all(o["meta_info"]["completion_tokens"] == 3 for o in outs)
    single = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2})
    assert single["meta_info"]["prompt_tokens"] == 3
    batch = engine.generate(input_ids=[[5, 6], [7, 8, 9]], sampling_params={"max_new_tokens": 2})
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [2, 3]


def test_n_and_rid(engine):
    outs = engine.generate("Hi", {"max_new_tokens": 2, "n": 3, "temperature": 1.0}, rid="my-rid")
    assert [o["meta_info"]["id"] for o in outs] == ["my-rid-0", "my-rid-1", "my-rid-2"]


def test_generate_stream(engine):
    engine.flush_cache()
    full = engine.generate("Stream", {"max_new_tokens": 6, **GREEDY})
    engine.flush_cache()
    chunks = list(engine.generate("Stream", {"max_new_tokens": 6, **GREEDY}, stream=True))
    assert len(chunks) >= 2
    assert chunks[-1]["text"] == full["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))


def test_stream_closed_early_aborts(engine):
    gen = engine.generate("abort me", {"max_new_tokens": 3000, **GREEDY}, stream=True)
    next(gen)
    gen.close()
    assert wait_until(lambda: engine.get_server_info()["internal_states"][0]["num_running_reqs"] == 0, 10.0)


def test_bad_input_raises_value_error(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate("", {"max_new_tokens": 2})
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate(input_ids=[10**6])
    with pytest.raises(ValueError):
        engine.generate("hi", stream=True, sampling_params={"bogus": 1})


def test_async_generate(engine):
    async def main():
        one = await engine.async_generate("Hello", {"max_new_tokens": 3, **GREEDY})
        many = await asyncio.gather(
            *[engine.async_generate(f"p{i}", {"max_new_tokens": 2}) for i in range(4)]
        )
        stream = await engine.async_generate("Hello", {"max_new_tokens": 3, **GREEDY}, stream=True)
        chunks = [c async for c in stream]
        return one, many, chunks

    one, many, chunks = asyncio.run(main())
    assert one["meta_info"]["completion_tokens"] == 3
    assert [m["meta_info"]["completion_tokens"] for m in many] == [2] * 4
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_sync_calls_from_threads(engine):
    results = []

    def work(i):
        results.append(
            engine.generate(f"thread {i}", {"max_new_tokens": 2})["meta_info"]["completion_tokens"]
        )

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [2] * 4


def test_server_info_and_unknown_kwarg(engine):
    info = engine.get_server_info()
    state = info["internal_states"][0]
    assert state["max_total_num_tokens"] == info["max_total_num_tokens"] > 0
    assert state["num_running_reqs"] == state["num_waiting_reqs"] == 0
    with pytest.raises(ValueError, match="unknown server argument"):
        sgl.Engine(no_such_flag=1, **ENGINE_KW)


def test_context_manager_and_shutdown_leave_no_child():
    with sgl.Engine(**ENGINE_KW) as eng:
        pids = eng.children.pids
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        assert eng.generate("hi", {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(RuntimeError):
        eng.generate("hi")


def test_dead_scheduler_fails_requests():
    eng = sgl.Engine(**ENGINE_KW)
    try:
        pids = eng.children.pids
        gen = eng.generate("pending", {"max_new_tokens": 3000, **GREEDY}, stream=True)
        next(gen)
        os.kill(pids[0], signal.SIGKILL)  # the scheduler is started first
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            list(gen)  # must fail instead of hanging
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            eng.generate("after", {"max_new_tokens": 2})
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10.0)
    finally:
        eng.shutdown()


def failing_scheduler(server_args, port_args, rank, pipe_writer):
    """A scheduler entry that fails during start-up (runs in the spawned child)."""
    raise ValueError("boom from the test scheduler")


def test_start_up_failure_reports_child_error():
    with pytest.raises(RuntimeError, match="boom from the test scheduler"):
        sgl.Engine(_scheduler_entry=failing_scheduler, **ENGINE_KW)


def rank1_fails_scheduler(server_args, port_args, rank, pipe_writer):
    """Rank 0 waits (as in a rendezvous that rank 1 never joins); rank 1 fails its start-up."""
    import time

    if rank == 0:
        time.sleep(120)
    raise ValueError(f"boom from rank {rank}")


def test_start_up_failure_of_another_rank_reports_its_error():
    # The ranks of one engine fail on the same check in any order; the error raised must be the
    # dead rank's own report, not a generic "exited before rank 0 was ready".
    with pytest.raises(RuntimeError, match="(?s)Scheduler rank 1 failed to start.*boom from rank 1"):
        sgl.Engine(_scheduler_entry=rank1_fails_scheduler, tp_size=2, **ENGINE_KW)
