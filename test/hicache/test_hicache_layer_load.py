"""HiCache's L2 -> L1 restores layer by layer (`layer_load.LayerLoader`): a KV pool access to layer
i returns once every restore submitted before it has copied layer i, and not before; the rows
are the host tier's; the host pool's other operations (free, backup, pack) wait for every restore;
a failed copy makes every later access raise instead of serving unknown KV. The copies are held
layer by layer by a gate the test opens (a real `copy_rows` copy behind it), so what has been
copied when is decided by the test, not by timing."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, copy_rows, kv_token_buffers
from sglang.srt.mem_cache.hicache.factory import layer_loader
from sglang.srt.mem_cache.hicache.layer_load import LayerLoader, StreamLoader, layer_groups
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.platforms import get_platform

LAYERS = 3


class GatedCopy:
    """`copy_rows`, each call (one layer) waiting for the test to open that layer's gate."""

    def __init__(self, layers: int):
        self.gates = [threading.Event() for _ in range(layers)]
        self.calls = 0

    def __call__(self, src, src_rows, dst, dst_rows) -> None:
        layer = self.calls % len(self.gates)
        self.calls += 1
        assert self.gates[layer].wait(10), "the test never opened the gate"
        copy_rows(src, src_rows, dst, dst_rows)


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
    """`copy_rows`: slots in long runs are copied slice by slice, scattered ones by index; both
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
        copy_rows(host, runs_src, dev, dst)
        for h, b in zip(host, dev):
            assert torch.equal(b[dst].view(torch.uint8), h[runs_src].view(torch.uint8))


class Recorder:
    """Stands in for an accelerator's streams and events (no GPU / NPU here): every call is logged;
    an event is complete once the test says so (or once synchronized)."""

    async_copies = True

    def __init__(self):
        self.log: list[tuple] = []
        self.events: list[SimpleNamespace] = []
        self.compute = self._stream("compute")
        self.current = self.compute

    def _stream(self, name: str) -> SimpleNamespace:
        log = self.log
        return SimpleNamespace(
            name=name,
            wait_stream=lambda other: log.append(("wait_stream", name, other.name)),
            wait_event=lambda ev: log.append(("wait_event", name, ev.i)),
        )

    def current_stream(self):
        return self.current

    def new_stream(self):
        return self._stream("copy")

    @contextlib.contextmanager
    def stream(self, s):
        previous, self.current = self.current, s
        yield
        self.current = previous

    def new_event(self):
        ev = SimpleNamespace(i=len(self.events), done=False)
        ev.record = lambda stream: self.log.append(("record", stream.name, ev.i))
        ev.query = lambda: ev.done
        ev.synchronize = lambda: (self.log.append(("synchronize", ev.i)), setattr(ev, "done", True))
        self.events.append(ev)
        return ev


def test_an_accelerator_loader_orders_copies_by_events():
    """`StreamLoader` (accelerators): each layer's copies are queued on the copy stream after the
    compute stream's work and followed by an event; an access makes the compute stream wait for
    its layer's event (the host does not block) unless it is complete; reusing host rows blocks
    the host on the last layer's event."""
    platform = Recorder()

    def copy(src, src_rows, dst, dst_rows):
        platform.log.append(("copy", platform.current.name))
        copy_rows(src, src_rows, dst, dst_rows)

    assert isinstance(layer_loader(layer_groups(6, LAYERS), platform), StreamLoader)
    assert isinstance(layer_loader(layer_groups(6, LAYERS), get_platform("cpu")), LayerLoader)
    pool, host = tiers(copy)
    loader = StreamLoader(layer_groups(2 * LAYERS, LAYERS), copy, platform)
    pool.attach_layer_gate(loader)
    host.loader = loader
    src, dst = torch.tensor([2, 3]), torch.tensor([6, 7])
    host.restore(src, dst)
    layer_ops = [("copy", "copy"), ("record", "copy")]
    assert platform.log == [("wait_stream", "copy", "compute")] + [
        (op, stream, *([i] if op == "record" else [])) for i in range(LAYERS) for op, stream in layer_ops
    ]
    platform.log.clear()
    assert torch.equal(pool.get_key_buffer(6)[dst], host.buffers[1][src])  # copied (CPU: at once)
    assert platform.log == [("wait_event", "compute", 1)]
    platform.events[1].done = True
    platform.log.clear()
    pool.get_key_buffer(6)
    assert platform.log == [] and loader.events[1] is None  # complete: nothing more to wait for
    host.free(host.alloc(2))
    assert platform.log == [("synchronize", LAYERS - 1)]
