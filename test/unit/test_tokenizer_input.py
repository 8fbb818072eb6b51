"""Request validation and expansion in front of the scheduler (tokenizer_input.prepare_requests)."""

from __future__ import annotations

import pytest

from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReadyInfo
from sglang.srt.managers.tokenizer.tokenizer_input import generate_req_from_dict, prepare_requests

INFO = SchedulerReadyInfo(
    max_total_num_tokens=1000, max_req_input_len=63, context_len=64, vocab_size=100, max_running_requests=8
)


class CharTokenizer:
    """One token per character (ord % 100)."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 100 for c in text]

    def decode(self, ids, **kwargs):
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()


def prep(**kw):
    return prepare_requests(GenerateReqInput(**kw), TOK, INFO)


def test_single_text_and_batch():
    (req,) = prep(text="abc", sampling_params={"max_new_tokens": 5})
    assert req.input_ids == [97, 98, 99] and req.sampling_params.max_new_tokens == 5
    reqs = prep(text=["a", "bb"], sampling_params=[{"max_new_tokens": 1}, {"max_new_tokens": 2}])
    assert [r.index for r in reqs] == [0, 1]
    assert [r.sampling_params.max_new_tokens for r in reqs] == [1, 2]
    assert len({r.rid for r in reqs}) == 2


def test_n_expansion_rids_and_seeds():
    reqs = prep(text="hi", sampling_params={"n": 3, "seed": 10}, rid="x")
    assert [r.rid for r in reqs] == ["x-0", "x-1", "x-2"]
    assert [r.sampling_params.seed for r in reqs] == [10, 11, 12]
    assert all(r.sampling_params.n == 1 for r in reqs)
    reqs = prep(text=["a", "b"], sampling_params={"n": 2})
    assert [r.index for r in reqs] == [0, 1, 2, 3] and [r.input_ids for r in reqs] == [[97], [97], [98], [98]]


def test_default_max_new_tokens_is_clamped_to_context():
    (req,) = prep(input_ids=[1] * 40)
    assert req.sampling_params.max_new_tokens == 24  # 64 - 40 (default would be 128)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(text=""), "empty"),
        (dict(input_ids=[]), "empty"),
        (dict(input_ids=[1, 100]), "vocabulary"),
        (dict(input_ids=[-1]), "vocabulary"),
        (dict(input_ids=[1] * 64), "maximum input length of 63 tokens \\(context length 64\\)"),
        (dict(input_ids=[1] * 40, sampling_params={"max_new_tokens": 30}), "context length"),
        (dict(text="hi", sampling_params={"temperature": -1}), "temperature"),
        (dict(text="hi", sampling_params={"nope": 1}), "nope"),
        (dict(text=5), "text"),
        (dict(text=["a", 3]), "text"),
        (dict(input_ids=[1, "2"]), "input_ids"),
        (dict(text=None), "either"),
        (dict(text="a", input_ids=[1]), "only one"),
        (dict(text=["a", "b"], sampling_params=[{}]), "entries"),
        (dict(text="a", stream="yes"), "stream"),
        (dict(text="a", top_logprobs_num=-1), "top_logprobs_num"),
        (dict(text="a", sampling_params=[{}]), "object"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        prep(**kwargs)


def test_duplicate_rid_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        prepare_requests(GenerateReqInput(text="a", rid="r"), TOK, INFO, rids_in_use={"r"})
    with pytest.raises(ValueError, match="duplicate"):
        prep(text=["a", "b"], rid=["r", "r"])


def test_generate_req_from_dict():
    obj = generate_req_from_dict({"text": "a", "stream": True, "lora_path": None, "image_data": []})
    assert obj.text == "a" and obj.stream is True
    with pytest.raises(ValueError, match="image_data"):
        generate_req_from_dict({"text": "a", "image_data": ["x.png"]})
    with pytest.raises(ValueError):
        generate_req_from_dict(["a"])


SMALL_POOL = SchedulerReadyInfo(
    max_total_num_tokens=30, max_req_input_len=29, context_len=64, vocab_size=100, max_running_requests=8
)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        # a prompt within the context but longer than the whole KV pool
        (dict(input_ids=[1] * 40), "KV cache pool can hold for one request: 30 tokens"),
        # prompt + max_new_tokens within the context but past the pool
        (
            dict(input_ids=[1] * 20, sampling_params={"max_new_tokens": 20}),
            "more than the KV cache pool's 30 tokens",
        ),
        # past the context names the context
        (dict(input_ids=[1] * 20, sampling_params={"max_new_tokens": 50}), "maximum context length is 64"),
    ],
)
def test_requests_that_cannot_fit_name_the_limit(kwargs, match):
    with pytest.raises(ValueError, match=match):
        prepare_requests(GenerateReqInput(**kwargs), TOK, SMALL_POOL)
    prepare_requests(
        GenerateReqInput(input_ids=[1] * 20, sampling_params={"max_new_tokens": 10}), TOK, SMALL_POOL
    )


def test_default_max_new_tokens_fits_small_kv_pool():
    info = SchedulerReadyInfo(
        max_total_num_tokens=30, max_req_input_len=29, context_len=64, vocab_size=100, max_running_requests=8
    )
    (req,) = prepare_requests(GenerateReqInput(input_ids=[1] * 20), TOK, info)
    assert req.sampling_params.max_new_tokens == 10
