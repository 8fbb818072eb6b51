"""The Mooncake data plane over real TCP on 127.0.0.1 (two transfer engines in one process):
a write far above the transport's per-peer queue (~2K transfers; a single batch of 3,000 entries
is rejected with rc -1, as seen under load in the PD benchmark) moves every byte, because
`MooncakeDataPlane.write` bounds its batches (a rejected batch is also resent in small batches
after a back-off; the queue's recovery after a rejection varies, so no test relies on it)."""

from __future__ import annotations

import numpy as np
import pytest

from sglang.srt.disaggregation.mooncake.data_plane import MAX_BATCH_ENTRIES, MooncakeDataPlane


def _pair():
    a, b = MooncakeDataPlane("127.0.0.1"), MooncakeDataPlane("127.0.0.1")
    src = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    a.register([(src.ctypes.data, src.nbytes)])
    b.register([(dst.ctypes.data, dst.nbytes)])
    return a, b, src, dst


def _plan(src, dst, n, size=384):
    offs = [i * 2 * size for i in range(n)]  # every other block: nothing coalesces
    return [src.ctypes.data + o for o in offs], [dst.ctypes.data + o for o in offs], [size] * n, offs


def test_write_of_many_entries_moves_every_byte():
    a, b, src, dst = _pair()
    n = 12 * MAX_BATCH_ENTRIES + 7  # 3,079 entries, past the transport's queue in one batch
    s, d, lens, offs = _plan(src, dst, n)
    assert a.write(b.session_id, s, d, lens) == 0
    for o in offs[::97] + offs[-1:]:
        assert np.array_equal(dst[o : o + 384], src[o : o + 384])
    assert not dst[384:768].any(), "the gaps between blocks were not written"


def test_batches_stay_under_the_transport_queue():
    """What the bound is for: one batch past the transport's per-peer queue is rejected, and the
    transfer threads' batches together stay below it."""
    from sglang.srt import envs

    a, b, src, dst = _pair()
    s, d, lens, _ = _plan(src, dst, 3000)
    assert a.engine.batch_transfer_sync_write(b.session_id, s, d, lens) != 0, (
        "the transport took 3000 at once"
    )
    assert MAX_BATCH_ENTRIES * envs.SGLANG_DISAGGREGATION_QUEUE_SIZE.get() <= 1024


def test_unknown_peer_fails_with_its_code():
    a, _, src, dst = _pair()
    s, d, lens, _ = _plan(src, dst, 4)
    assert a.write("127.0.0.1:1", s, d, lens) != 0
