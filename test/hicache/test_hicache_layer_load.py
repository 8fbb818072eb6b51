"""HiCache's L2 -> L1 restores layer by layer (`layer_load.LayerLoader`): a KV pool access to layer
i returns once every restore submitted before it has copied layer i, and not before; the rows
are the host tier's; the host pool's other operations (free, backup, pack) wait for every restore;
a failed copy makes every later access raise instead of serving unknown KV. The copies are held
layer by layer by a gate the test opens (a real `SyncCopier` copy behind it), so what has been
copied when is decided by the test, not by timing."""

from __future__ import annotations

import threading

import pytest
import torch

from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, SyncCopier, kv_token_buffers
from sglang.srt.mem_cache.hicache.layer_load import LayerLoader, layer_groups
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

LAYERS = 3


class GatedCopy:
    """`SyncCopier.copy`, each call (one layer) waiting for the test to open that layer's gate."""

    def __init__(self, layers: int):
        self.gates = [threading.Event() for _ in range(layers)]
        self.calls = 0

    def __call__(self, src, src_rows, dst, dst_rows) -> None:
        layer = self.calls % len(self.gates)
        self.calls += 1
        assert self.gates[layer].wait(10), "the test never opened the gate"
        SyncCopier().copy(src, src_rows, dst, dst_rows)


def tiers(copy):
    pool = MHATokenToKVPool(16, 2, torch.float32, head_num=2, head_dim=4, layer_num=LAYERS, start_layer=5)
    buffers = kv_token_buffers(pool)
    loader = LayerLoader(layer_groups(len(buffers), pool.layer_num), copy)
    pool.attach_layer_gate(loader)
    host = HostKVPool(buffers, 32, 2, loader=loader)
    for b in host.buffers:
        b.copy_(torch.randn_like(b))
    return pool, host


class Access(threading.Thread):
    """Reads a layer's key rows from another thread; `done` once the access returned."""

    def __init__(self, pool, layer: int, rows: torch.Tensor):
        super().__init__(daemon=True)
        self.pool, self.layer, self.rows = pool, layer, rows
        self.done = threading.Event()
        self.got = None

    def run(self) -> None:
        self.got = self.pool.get_key_buffer(self.layer)[self.rows].clone()
        self.done.set()


def test_groups_follow_the_buffer_order():
    assert layer_groups(6, 3) == [[0, 3], [1, 4], [2, 5]]
    assert layer_groups(3, 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="do not split"):
        layer_groups(5, 3)


def test_an_access_waits_for_its_layer_only():
    copy = GatedCopy(LAYERS)
    pool, host = tiers(copy)
    src, dst = torch.tensor([2, 3, 4]), torch.tensor([6, 7, 9])
    host.restore(src, dst)  # returns at once: the copy is the loader's
    first, last = Access(pool, 5, dst), Access(pool, 7, dst)
    first.start()
    last.start()
    assert not first.done.wait(0.05) and not last.done.wait(0.01)
    copy.gates[0].set()
    assert first.done.wait(10)
    assert torch.equal(first.got, host.buffers[0][src])  # layer 5 = local 0: K rows copied
    assert not last.done.wait(0.05)  # layer 7 waits for its own copy
    copy.gates[1].set()
    copy.gates[2].set()
    assert last.done.wait(10)
    assert torch.equal(last.got, host.buffers[2][src])
    assert torch.equal(pool.get_value_buffer(7)[dst], host.buffers[LAYERS + 2][src])


def test_host_rows_are_not_freed_under_a_running_restore():
    copy = GatedCopy(LAYERS)
    pool, host = tiers(copy)
    src = host.alloc(4)
    host.restore(src, torch.tensor([2, 3, 4, 5]))
    freed = threading.Event()

    def free() -> None:
        host.free(src)
        freed.set()

    threading.Thread(target=free, daemon=True).start()
    copy.gates[0].set()
    copy.gates[1].set()
    assert not freed.wait(0.05)  # the last layer still reads the rows
    copy.gates[2].set()
    assert freed.wait(10) and host.available_size() == host.size


def test_a_failed_copy_is_never_served():
    def broken(src, src_rows, dst, dst_rows) -> None:
        raise OSError("copy engine fault")

    pool, host = tiers(broken)
    host.restore(torch.tensor([2]), torch.tensor([6]))
    with pytest.raises(RuntimeError, match="layer-by-layer KV load failed"):
        pool.get_key_buffer(5)
    with pytest.raises(RuntimeError, match="layer 0"):
        host.backup(torch.tensor([6]), torch.tensor([8]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_copies_by_runs_and_by_index_agree(dtype):
    """`SyncCopier`: slots in long runs are copied slice by slice, scattered ones by index; both
    give the rows of the other tier (the MHA pool's head-major K / V views included)."""
    pool = MHATokenToKVPool(300, 1, torch.float32, head_num=2, head_dim=4, layer_num=1, kv_dtype=dtype)
    dev = kv_token_buffers(pool)
    host = [torch.randn(401, *b.shape[1:]).to(dtype) for b in dev]
    runs_src = torch.cat([torch.arange(10, 110), torch.arange(200, 300)])  # two runs of 100
    runs_dst = torch.cat([torch.arange(150, 250), torch.arange(1, 101)])
    scattered_dst = torch.randperm(300)[:200] + 1
    for dst in (runs_dst, scattered_dst):
        for b in dev:
            b.zero_()
        SyncCopier().copy(host, runs_src, dev, dst)
        for h, b in zip(host, dev):
            assert torch.equal(b[dst].view(torch.uint8), h[runs_src].view(torch.uint8))
