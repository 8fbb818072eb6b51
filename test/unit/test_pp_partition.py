"""Pipeline parallelism pieces without process groups: the layer partition rule and its errors,
the micro-batch message later stages rebuild their batch and req_to_token mirror from, and the
typed inbox."""

from __future__ import annotations

import threading

import pytest
import torch

from sglang.srt import envs
from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.pp_comm import Inbox
from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.managers.pp.messages import MsgType, StageBatch
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch, ScheduledReq
from sglang.srt.models.utils import pp_layer_range, pp_partition
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import TINY_LLAMA_DIR


# ---------------------------------------------------------------------------- partition
def test_default_split_gives_the_remainder_to_the_last_stages():
    assert pp_partition(30, 4) == [7, 7, 8, 8]
    assert pp_partition(61, 4) == [15, 15, 15, 16]
    assert pp_partition(4, 3) == [1, 1, 2]
    assert pp_partition(4, 4) == [1, 1, 1, 1]
    assert [pp_layer_range(30, r, 4) for r in range(4)] == [(0, 7), (7, 14), (14, 22), (22, 30)]


def test_explicit_and_env_partition(monkeypatch):
    assert [pp_layer_range(4, r, 3, [1, 2, 1]) for r in range(3)] == [(0, 1), (1, 3), (3, 4)]
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", " 2, 1 ,1")
    assert envs.SGLANG_PP_LAYER_PARTITION.get() == [2, 1, 1]
    assert [pp_layer_range(4, r, 3) for r in range(3)] == [(0, 2), (2, 3), (3, 4)]
    assert pp_layer_range(4, 0, 1) == (0, 4)  # one stage: nothing to partition, the variable is ignored


@pytest.mark.parametrize(
    "partition, pp, message",
    [
        ("1,2", 3, r"SGLANG_PP_LAYER_PARTITION=1,2 has 2 entries but --pp-size is 3"),
        ("1,1,1", 3, r"SGLANG_PP_LAYER_PARTITION=1,1,1 sums to 3 but the model has 4 layers"),
        ("0,2,2", 3, r"SGLANG_PP_LAYER_PARTITION=0,2,2: every stage needs at least one layer"),
        (
            "1;3",
            2,
            r"environment variable SGLANG_PP_LAYER_PARTITION='1;3': expected comma-separated integers",
        ),
        (None, 5, r"--pp-size 5 is larger than the model's number of layers \(4\)"),
    ],
)
def test_bad_partitions_are_clear_errors(monkeypatch, partition, pp, message):
    if partition is not None:
        monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", partition)
    with pytest.raises(ValueError, match=message):
        pp_partition(4, pp)
    with pytest.raises(ValueError, match=message):  # caught when the server arguments are checked
        check_server_args(ServerArgs(model_path=TINY_LLAMA_DIR, load_format="dummy", pp_size=pp))


def test_server_args_accept_pipeline_flags():
    args = ServerArgs(model_path=TINY_LLAMA_DIR, load_format="dummy", pp_size=2, pp_trace_path="/tmp/t.json")
    check_server_args(args)
    with pytest.raises(ValueError, match="--pp-async-batch-depth must be >= 0"):
        ServerArgs(
            model_path=TINY_LLAMA_DIR, load_format="dummy", pp_size=2, pp_async_batch_depth=-1
        ).validate()


# ---------------------------------------------------------------------------- micro-batch message
def _req(rid: str, prompt: list[int], row: int, cached: int, outputs: list[int] = ()) -> Req:
    r = Req(rid, prompt, SamplingParams(max_new_tokens=4, temperature=0.0))
    r.output_ids = list(outputs)
    r.req_pool_idx, r.cached_prefix_len = row, cached
    return r


def test_stage_batch_rebuilds_the_batch_and_the_req_to_token_rows():
    table = torch.zeros((4, 32), dtype=torch.int64)
    fresh = _req("fresh", list(range(10, 22)), row=1, cached=3)  # admitted with a 3-token radix hit
    going = _req("going", list(range(30, 40)), row=3, cached=0, outputs=[7])  # decoding, 10 tokens stored
    table[1, :3] = torch.tensor([50, 51, 52])
    table[3, :10] = torch.arange(60, 70)
    batch = ScheduleBatch([ScheduledReq(going, 10, 1), ScheduledReq(fresh, 3, 5)])
    loc = torch.tensor([70, 80, 81, 82, 83, 84])
    table[3, 10] = 70
    table[1, 3:8] = loc[1:]
    wb = batch.to_worker_batch(loc)
    msg = StageBatch.from_schedule(9, batch, wb, table)
    assert msg.prefix_slots == {1: [50, 51, 52]}  # only the first step after admission carries its prefix

    mirror = torch.zeros_like(table)
    mirror[3, :10] = table[3, :10]  # earlier micro-batches wrote this row already
    msg.apply_rows(mirror)
    assert torch.equal(mirror[1, :8], table[1, :8]) and torch.equal(mirror[3, :11], table[3, :11])
    rebuilt = msg.to_worker_batch()
    assert rebuilt.positions == wb.positions == [10, 3, 4, 5, 6, 7]
    assert torch.equal(rebuilt.out_cache_loc, loc)
    assert (rebuilt.sample_rows, rebuilt.output_ids, rebuilt.prefix_lens) == ([0], [[7]], [10, 3])
    assert rebuilt.prompt_ids == [[]]  # no repetition penalty: the prompt does not travel
    assert msg.trace_args(1)["rids"] == ["going", "fresh"] and "chunk_len" not in msg.trace_args(1)


# ---------------------------------------------------------------------------- inbox
def test_inbox_demultiplexes_by_type_in_arrival_order():
    inbox = Inbox()
    for mtype, mb in [(MsgType.OUTPUT, 0), (MsgType.BATCH, 5), (MsgType.PROXY, 5), (MsgType.OUTPUT, 1)]:
        inbox.put(Message(mtype, mb))
    assert inbox.take(MsgType.PROXY).mb_id == 5  # a proxy is never taken for an output
    assert [m.mb_id for m in inbox.take_all(MsgType.OUTPUT)] == [0, 1]
    assert inbox.take((MsgType.STOP, MsgType.BATCH)).mb_id == 5
    assert inbox.take(MsgType.BATCH, block=False) is None

    threading.Timer(0.05, lambda: inbox.put(Message(MsgType.STOP, -1))).start()
    assert inbox.take((MsgType.BATCH, MsgType.STOP)).kind == MsgType.STOP  # blocks until it arrives
    inbox.fail("peer gone")
    with pytest.raises(RuntimeError, match="pipeline link failed: peer gone"):
        inbox.take(MsgType.OUTPUT)
