"""PromptLogprobs bookkeeping (no model): which rows a step must compute, the radix limit while
entries are missing, each entry once across re-prefills; and the meta_info shape the tokenizer
manager builds (upstream's `[logprob, token_id, text]` entries, text None unless asked)."""

from __future__ import annotations

import pytest

from sglang.srt.managers.io_struct import GenerateReqInput, InputLogprobsOut, SchedulerReadyInfo
from sglang.srt.managers.scheduler.prompt_logprobs import PromptLogprobs
from sglang.srt.managers.tokenizer.tokenizer_input import PreparedReq, prepare_requests
from sglang.srt.managers.tokenizer.tokenizer_output import OutputBuilder
from sglang.srt.managers.tokenizer.tokenizer_state import GenerateCall, ReqState
from sglang.srt.sampling.sampling_params import SamplingParams

PROMPT = [10, 11, 12, 13, 14, 15]


def test_start_zero_has_a_null_first_entry_and_no_radix_prefix():
    lp = PromptLogprobs.create(PROMPT, 0, top_num=0, token_ids=None)
    assert lp.token_logprobs == [(None, 10)] and lp.next_token == 1
    assert lp.max_prefix() == 0
    assert lp.rows(0, 4) == (0, 4)  # rows 0..3 predict tokens 1..4
    assert lp.rows(4, 2) == (4, 1)  # row 5 predicts the first output token: not a prompt entry


def test_entries_arrive_once_across_chunks_and_re_prefills():
    lp = PromptLogprobs.create(PROMPT, 3, top_num=1, token_ids=[7])
    assert lp.max_prefix() == 2 and lp.rows(0, 6) == (2, 3)
    lp.add(2, [-1.0], [[(-0.5, 9)]], [[(-3.0, 7)]])  # a chunk ending at position 2
    lp.add(2, [-1.0, -2.0], [[(-0.5, 9)], [(-0.6, 9)]], [None, None])  # re-prefill: the first is known
    assert lp.token_logprobs == [(-1.0, 13), (-2.0, 14)]
    assert lp.rows(0, 6) == (4, 1) and not lp.done
    lp.add(4, [-3.0], [[(-0.7, 9)]], [[(-4.0, 7)]])
    assert lp.done and lp.max_prefix() is None and lp.rows(0, 6) == (0, 0)
    assert lp.token_logprobs[-1] == (-3.0, 15) and lp.top_logprobs[0] == [(-0.5, 9)]


class _Tok:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def _state(with_text: bool, token_ids) -> ReqState:
    req = PreparedReq(0, "r", None, PROMPT, SamplingParams(), False, True, 1, with_text, 0, token_ids)
    state = ReqState(req=req, call=GenerateCall(obj=GenerateReqInput(input_ids=PROMPT), reqs=[req]))
    state.input_logprobs = InputLogprobsOut(
        [(None, 10), (-1.0, 11)], [None, [(-0.5, 11)]], [None, [(-2.0, 7)]] if token_ids else [None, None]
    )
    state.output_token_logprobs = [(-0.1, 12)]
    state.output_top_logprobs = [[(-0.1, 12)]]
    if token_ids:
        state.output_token_ids_logprobs = [[(-5.0, 7)]]
    return state


def test_meta_info_shapes():
    meta = OutputBuilder(_Tok()).build_output(_state(True, [7]))["meta_info"]
    assert meta["input_token_logprobs"] == [(None, 10, "<10>"), (-1.0, 11, "<11>")]
    assert meta["input_top_logprobs"] == [None, [(-0.5, 11, "<11>")]]
    assert meta["input_token_ids_logprobs"] == [None, [(-2.0, 7, "<7>")]]
    assert meta["output_token_logprobs"] == [(-0.1, 12, "<12>")]
    assert meta["output_token_ids_logprobs"] == [[(-5.0, 7, "<7>")]]
    plain = OutputBuilder(_Tok()).build_output(_state(False, None))["meta_info"]
    assert plain["input_token_logprobs"] == [(None, 10, None), (-1.0, 11, None)]
    assert "input_token_ids_logprobs" not in plain and "output_token_ids_logprobs" not in plain


def test_batch_token_ids_logprob_spellings():
    flat = GenerateReqInput(text=["a", "b"], token_ids_logprob=[1, 2])
    per = GenerateReqInput(text=["a", "b"], token_ids_logprob=[[1], [2, 3]])
    assert flat[1].token_ids_logprob == [1, 2] and per[1].token_ids_logprob == [2, 3]


def test_logprob_fields_checked_at_the_door():
    info = SchedulerReadyInfo(4096, 1000, 2048, 100, 8)
    ok = prepare_requests(
        GenerateReqInput(input_ids=PROMPT, return_logprob=True, logprob_start_len=5, token_ids_logprob=[1]),
        None,
        info,
    )
    assert ok[0].logprob_start_len == 5 and ok[0].token_ids_logprob == [1]
    off = prepare_requests(GenerateReqInput(input_ids=PROMPT, logprob_start_len=3), None, info)
    assert off[0].logprob_start_len == -1  # without return_logprob nothing is computed
    for bad, match in (
        (dict(logprob_start_len=6), "logprob_start_len"),
        (dict(logprob_start_len=-2), "logprob_start_len"),
        (dict(token_ids_logprob=[100]), "token_ids_logprob"),
    ):
        with pytest.raises(ValueError, match=match):
            prepare_requests(GenerateReqInput(input_ids=PROMPT, return_logprob=True, **bad), None, info)
