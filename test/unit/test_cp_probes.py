"""The overlap probes' verdicts (`SendProbe.send_overlap`, `CPProbe`) on hand-made event orders,
and the segmented DSA selection's running top-k merge equal to the top-k over all keys at once."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.cp_probe import CPProbe
from sglang.srt.layers.attention.dsa.scoring import select_topk
from sglang.srt.layers.attention.mla_cp_segments import _merge_candidates
from sglang.srt.managers.pp.stage import PendingRing
from sglang.srt.managers.pp.trace import PPTracer, SendProbe


class _Send:
    def __init__(self) -> None:
        self.works = [object()]
        self.waited = False

    def wait(self) -> None:
        self.works, self.waited = [], True


def _ring(size: int = 2) -> PendingRing:
    ring = PendingRing(size, PPTracer(None, 0, 0, 0))
    ring.probe = SendProbe()
    return ring


def _loop(ring: PendingRing, n: int, sync: bool) -> None:
    """The driver's order per micro-batch: commit the slot, forward, send (optionally waited at once)."""
    for mb in range(n):
        ring.commit(mb)
        ring.forward_started(mb)
        send = _Send()
        ring.add(mb, send)
        if sync:
            ring.commit_all()
    ring.commit_all()


def test_send_probe_sees_overlap_and_synchronous_sends():
    ring = _ring()
    _loop(ring, 5, sync=False)
    assert ring.probe.send_overlap() == {"overlapped": 4, "synchronous": 0, "tail": 1, "waited_at_issue": 0}
    ring = _ring()
    _loop(ring, 5, sync=True)
    got = ring.probe.send_overlap()
    assert got["synchronous"] == 4 and got["overlapped"] == 0


def test_send_probe_sees_a_send_waited_before_the_ring():
    ring = _ring()
    ring.forward_started(0)
    send = _Send()
    send.wait()
    ring.add(0, send)
    assert ring.probe.send_overlap()["waited_at_issue"] == 1


def test_ring_without_probe_waits_sends():
    ring = PendingRing(2, PPTracer(None, 0, 0, 0))
    sends = [_Send() for _ in range(3)]
    for mb, s in enumerate(sends):
        ring.commit(mb)
        ring.add(mb, s)
    assert [s.waited for s in sends] == [True, False, False]


class _Pending:
    def __init__(self, work) -> None:
        self.work, self.on_wait = work, None


def test_cp_probe_trace_and_rounds():
    probe = CPProbe()
    early, lazy = _Pending(object()), _Pending(None)
    probe.started(0, early, early=True)
    probe.mark("q_proj", 0)
    early.on_wait()
    probe.started(1, lazy, early=False)
    lazy.on_wait()
    assert probe.order(0) == ["gather_start", "q_proj", "gather_wait"]
    assert probe.order(1) == ["gather_start", "gather_wait"]
    assert probe.lazy_starts == 1 and probe.async_starts == 1
    for rows in (7, 7, 3):
        probe.prefix_round(rows, rows + 1)
    assert (probe.peak_round_rows, probe.peak_buffer_rows, probe.prefix_rows) == (7, 8, 17)
    probe.prefix_round(4, 6, row_bytes=100)
    assert probe.peak_buffer_bytes == 600 and probe.peak_buffer_rows == 8


def test_running_topk_merge_equals_topk_over_all_keys():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 40, generator=g).round(decimals=1)  # rounded: ties to the earlier position
    scores[1, 30:] = float("-inf")
    want_vals, want_idx = select_topk(scores, 8)
    acc = None
    for a in range(0, 40, 7):
        v, i = select_topk(scores[:, a : a + 7], 8)
        acc = _merge_candidates(acc, (v, (i + a).masked_fill(i < 0, -1)), 8)
    assert torch.equal(acc[1], want_idx) and torch.equal(acc[0], want_vals)


class _Group:
    size, rank = 2, 0


def test_gather_segment_flag_reaches_the_layout():
    import dataclasses
    from types import SimpleNamespace

    import pytest

    from sglang.srt.layers.cp_runtime import CPRuntime
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "m", "--cp-kv-gather-segment", "777"])
    assert args.cp_kv_gather_segment == 777
    assert prepare_server_args(["--model-path", "m"]).cp_kv_gather_segment is None
    unset = SimpleNamespace(page_size=1, cp_kv_gather_segment=None)
    # not given: 16K-row rounds for MHA; one gather for MLA / DSA (rounds cost more there: measured)
    assert CPRuntime.from_server_args(unset, _Group()).kv_gather_segment == 16384
    assert CPRuntime.from_server_args(unset, _Group(), None, "mla").kv_gather_segment == 0
    given = SimpleNamespace(page_size=1, cp_kv_gather_segment=777)
    assert CPRuntime.from_server_args(given, _Group(), None, "mla").kv_gather_segment == 777
    rt = CPRuntime.from_server_args(given, _Group())
    probe = CPProbe()
    batch = SimpleNamespace(cp_layout=None, extend_seq_lens_cpu=[9, 1], extend_prefix_lens_cpu=[20, 5])
    layout = dataclasses.replace(rt, probe=probe).attach(batch)
    assert batch.cp_layout is layout and layout.kv_gather_segment == 777 and layout.probe is probe
    with pytest.raises(ValueError):
        CPRuntime.from_server_args(SimpleNamespace(page_size=1, cp_kv_gather_segment=-1), _Group())


def test_min_split_tokens_resolves_flag_then_env_then_platform(monkeypatch):
    """Not given and no env: the platform's measured bar (CPU 512: shorter prompts run whole);
    the env (the suite pins 0) and the flag win in that order."""
    from types import SimpleNamespace

    from sglang.srt.layers.cp_runtime import CPRuntime
    from sglang.srt.platforms.cpu import CpuPlatform

    unset = SimpleNamespace(page_size=1, cp_kv_gather_segment=None, cp_min_split_tokens=None)
    monkeypatch.delenv("SGLANG_CP_MIN_SPLIT_TOKENS", raising=False)
    assert CPRuntime.from_server_args(unset, _Group(), CpuPlatform).min_split_tokens == 512
    monkeypatch.setenv("SGLANG_CP_MIN_SPLIT_TOKENS", "0")
    assert CPRuntime.from_server_args(unset, _Group(), CpuPlatform).min_split_tokens == 0
    given = SimpleNamespace(page_size=1, cp_kv_gather_segment=None, cp_min_split_tokens=64)
    assert CPRuntime.from_server_args(given, _Group(), CpuPlatform).min_split_tokens == 64
