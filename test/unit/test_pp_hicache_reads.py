"""A later pipeline stage reads a storage query's pages on its I/O thread
(`hicache_ring.StageHiCache`): while a read is held up (a real `FileStorage` whose `get` waits on a
gate the test opens) the stage goes on taking messages (TIERS are replayed); once read, the I/O
thread puts a READ in the stage's inbox and the stage loop passes the lowered query on (answers
stage 0 on the last stage, in query order). Real parts: the pipeline inbox, `StageTiers` over a
host pool and a file directory; the outgoing link is a recorder (the ring's sends are tested by
the pp engine tests)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.pp_comm import Inbox
from sglang.srt.managers.pp.hicache_ring import StageHiCache
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, kv_token_buffers
from sglang.srt.mem_cache.hicache.pipeline import Backup, StageTiers, StorageQuery
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

SP = 4  # storage page tokens


class GatedStorage(FileStorage):
    """A file backend whose reads wait until the test opens `gate`."""

    def __init__(self, *args):
        super().__init__(*args)
        self.gate = threading.Event()

    def get(self, name: str):
        self.gate.wait(10)
        return super().get(name)


class Recorder:
    """The stage's outgoing link: what it sent, in order."""

    def __init__(self):
        self.sent: list[tuple[int, object]] = []

    def send_return(self, kind, mb_id, obj=None):
        self.sent.append((kind, obj))
        return None


def stage_with_pages(tmp_path, gate_open: bool):
    """A last stage whose store holds two pages of `tokens` (its KV pool's slots 0..7 packed);
    its outgoing link records. Returns (stage, comm, recorder, host, tokens, the pages' rows)."""
    pool = MHATokenToKVPool(16, 2, torch.float32, head_num=2, head_dim=4, layer_num=2)
    host = HostKVPool(kv_token_buffers(pool), 32, 2)
    storage = GatedStorage(str(tmp_path), "stage1", SP)
    if gate_open:
        storage.gate.set()
    tokens = list(range(3, 3 + 2 * SP))
    for buf in host.device_buffers:
        buf[: 2 * SP] = torch.randn(2 * SP, *buf.shape[1:])
    want = [buf[: 2 * SP].clone() for buf in host.device_buffers]
    names = storage.page_hashes(tokens, 2)
    assert storage.put_many(names, [host.pack(torch.arange(i * SP, (i + 1) * SP)) for i in range(2)]) == 2
    rec = Recorder()
    comm = SimpleNamespace(inbox=Inbox(), send_return=rec.send_return)
    return StageHiCache(StageTiers(host, storage), comm, is_last=True), comm, rec, host, tokens, want


def test_reads_run_beside_the_stage_loop_and_answer_in_order(tmp_path):
    stage, comm, rec, host, tokens, want = stage_with_pages(tmp_path, gate_open=False)
    stage.handle(Message(MsgType.QUERY, -1, StorageQuery(1, tokens, 0, 2, list(range(16, 24)))))
    stage.handle(Message(MsgType.QUERY, -1, StorageQuery(2, tokens, 1, 1, list(range(24, 28)))))
    # both reads wait at the gate; the stage loop goes on: a later TIERS (L1 -> L2 copy) is replayed
    stage.handle(Message(MsgType.TIERS, -1, [Backup([0, 1], [2, 3])]))
    assert all(torch.equal(h[2:4], w[:2]) for h, w in zip(host.buffers, want))
    assert rec.sent == [] and comm.inbox.take(MsgType.READ, block=False) is None
    stage.tiers.storage.gate.set()
    for _ in range(2):
        stage.handle(comm.inbox.take(StageHiCache.KINDS))
    assert [(k, a.query_id, a.count) for k, a in rec.sent] == [(MsgType.ANSWER, 1, 2), (MsgType.ANSWER, 2, 1)]
    for buf, w in zip(host.buffers, want):
        assert torch.equal(buf[16:24], w) and torch.equal(buf[24:28], w[SP:])


def test_a_read_skips_the_cached_rows_and_counts_a_bad_page(tmp_path):
    stage, comm, rec, host, tokens, want = stage_with_pages(tmp_path, gate_open=True)
    rows = list(range(20, 20 + 2 * SP - 1))  # the first page's first row is already cached
    stage.handle(Message(MsgType.QUERY, -1, StorageQuery(5, tokens, 0, 2, rows, skip=1)))
    stage.handle(comm.inbox.take(MsgType.READ))
    for buf, w in zip(host.buffers, want):
        assert torch.equal(buf[20 : 20 + 2 * SP - 1], w[1:])
    path = stage.tiers.storage._path(stage.tiers.storage.page_hashes(tokens, 2)[1])
    with open(path, "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)[0]
        fh.seek(-1, 2)
        fh.write(bytes([last ^ 0xFF]))
    stage.handle(Message(MsgType.QUERY, -1, StorageQuery(6, tokens, 0, 2, rows, skip=1)))
    stage.handle(comm.inbox.take(MsgType.READ))
    assert [(a.query_id, a.count, a.peer_read_failures) for _, a in rec.sent] == [(5, 2, 0), (6, 1, 1)]
