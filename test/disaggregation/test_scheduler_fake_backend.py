"""The PD components inside an in-process Scheduler with the fake backend (tiny Llama, dummy
weights; no network): the prefill side runs a request through bootstrap -> prefill -> inflight and
releases its KV; the decode side pre-allocates, lands the (fake) first token and decodes; aborts
in every queue free everything; requests without bootstrap fields are refused; a retracted
prefill request sends its KV again from position 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.scheduler_harness import SchedulerHarness

TINY = str(Path(__file__).resolve().parents[2] / "python" / "sglang" / "test" / "assets" / "tiny-llama")


def _harness(mode: str) -> SchedulerHarness:
    return SchedulerHarness(
        model_path=TINY,
        load_format="dummy",
        max_total_tokens=512,
        chunked_prefill_size=8,
        disaggregation_mode=mode,
        disaggregation_transfer_backend="fake",
    )


def _submit(h: SchedulerHarness, rid: str, ids: list[int], new: int = 4, room: int = 1) -> None:
    sp = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    h.scheduler.handle_message(
        TokenizedGenerateReqInput(rid, None, ids, sp, bootstrap_host="h", bootstrap_room=room)
    )


@pytest.fixture(scope="module")
def prefill():
    return _harness("prefill")


@pytest.fixture(scope="module")
def decode():
    return _harness("decode")


def _free(h: SchedulerHarness) -> bool:
    s = h.scheduler
    return s.cache.available_tokens() == s.runner.max_total_num_tokens and not s.has_work


def test_prefill_side_one_token_then_release(prefill):
    _submit(prefill, "p1", list(range(5, 30)))  # 25 tokens: 4 chunks of 8
    assert prefill.scheduler.disagg.bootstrap_queue  # waits for the handshake first
    prefill.run()
    assert len(prefill.outputs["p1"]) == 1 and prefill.finish["p1"]["type"] == "length"
    assert _free(prefill)


def test_decode_side_lands_first_token_and_decodes(decode):
    _submit(decode, "d1", list(range(5, 30)), new=5)
    decode.run()
    assert decode.outputs["d1"][0] == 0  # the fake backend's first token
    assert len(decode.outputs["d1"]) == 5 and decode.finish["d1"]["type"] == "length"
    assert _free(decode)


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_abort_in_every_queue(prefill, decode, steps):
    for h, rid in ((prefill, f"pa{steps}"), (decode, f"da{steps}")):
        _submit(h, rid, list(range(50 + 40 * steps, 85 + 40 * steps)), new=8)  # no prefix-cache hit
        for _ in range(steps):
            h.step()
        h.scheduler.handle_message(AbortReq(rid=rid))
        h.run()
        assert h.finish[rid]["type"] == "abort", (rid, h.finish.get(rid))
        assert _free(h)


def test_missing_bootstrap_fields_refused(prefill):
    sp = SamplingParams(max_new_tokens=2)
    prefill.scheduler.handle_message(TokenizedGenerateReqInput("nb", None, [5, 6, 7], sp))
    prefill.run()
    assert prefill.finish["nb"]["type"] == "abort" and "bootstrap" in prefill.finish["nb"]["message"]


def test_retraction_resends_from_zero(prefill):
    sent: list[np.ndarray] = []
    _submit(prefill, "r1", list(range(300, 325)))  # no prefix-cache hit
    entry = prefill.scheduler.disagg.entries["r1"]
    orig = entry.sender.send
    entry.sender.send = lambda pos, slots: (sent.append(np.array(pos)), orig(pos, slots))
    for _ in range(3):
        prefill.step()
    assert sent and entry.sent > 0
    req = entry.req
    prefill.scheduler._requeue(req)  # what the scheduler does under KV pressure
    assert entry.sent == 0
    prefill.run()
    assert sent[-1][-1] == 24 and any(p[0] == 0 for p in sent[1:])  # sent again from 0, up to the end
    assert _free(prefill)


def test_pd_queue_metrics_follow_the_components(prefill, decode):
    """/metrics' PD gauges read the real components' state: a request held in the prefill side's
    bootstrap queue and in the decode side's queues counts, and is gone once it ran."""
    from sglang.srt.metrics.collector import ServerMetrics

    def gauges(h: SchedulerHarness) -> dict:
        m = ServerMetrics("m")
        m.update_scheduler_state(h.scheduler.internal_state())
        text = m.render().decode()
        names = (
            "num_prefill_prealloc_queue_reqs",
            "num_decode_prealloc_queue_reqs",
            "num_decode_transfer_queue_reqs",
        )
        return {
            n: float(line.split()[-1])
            for line in text.splitlines()
            for n in names
            if line.startswith(f"sglang:{n}{{")
        }

    _submit(prefill, "pm", list(range(400, 420)), room=7)
    assert gauges(prefill)["num_prefill_prealloc_queue_reqs"] == 1
    prefill.run()
    assert gauges(prefill)["num_prefill_prealloc_queue_reqs"] == 0
    _submit(decode, "dm", list(range(400, 420)), room=8)
    queued = gauges(decode)
    assert queued["num_decode_prealloc_queue_reqs"] + queued["num_decode_transfer_queue_reqs"] == 1
    decode.run()
    after = gauges(decode)
    assert after["num_decode_prealloc_queue_reqs"] == after["num_decode_transfer_queue_reqs"] == 0
