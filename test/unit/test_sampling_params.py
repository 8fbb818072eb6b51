"""SamplingParams: parsing, type errors, range checks, normalisation."""

import pytest

from sglang.srt.sampling.sampling_params import SamplingParams


def test_defaults_match_sglang():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.temperature, p.top_p, p.top_k) == (128, 0, 1.0, 1.0, -1)
    assert (p.min_p, p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 0.0, 1.0)
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.ignore_eos and not p.no_stop_trim and p.n == 1 and p.seed is None
    assert not p.is_greedy


def test_from_dict_converts_and_defaults():
    p = SamplingParams.from_dict(
        {"temperature": 0, "top_k": 5.0, "max_new_tokens": None, "stop": ["a"], "sampling_seed": 7}
    )
    assert p.temperature == 0.0 and isinstance(p.temperature, float)
    assert p.top_k == 5 and isinstance(p.top_k, int)
    assert p.max_new_tokens == 128  # None means default
    assert p.stop == ["a"] and p.seed == 7
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict({"regex": None}) == SamplingParams()


def test_from_dict_unknown_key():
    with pytest.raises(ValueError, match="unknown sampling parameter 'foo'"):
        SamplingParams.from_dict({"foo": 1})
    with pytest.raises(ValueError, match="'custom_params' is not supported"):
        SamplingParams.from_dict({"custom_params": {"a": 1}})


def test_grammar_fields():
    assert SamplingParams.from_dict({"regex": "a+"}).regex == "a+"
    assert SamplingParams.from_dict({"json_schema": {"type": "object"}}).json_schema == '{"type": "object"}'
    assert SamplingParams.from_dict({"ebnf": 'root ::= "a"'}).ebnf == 'root ::= "a"'
    with pytest.raises(ValueError, match="regex must be a string"):
        SamplingParams.from_dict({"regex": 5})


@pytest.mark.parametrize(
    "key,value,msg",
    [
        ("temperature", "abc", "temperature must be a number, got 'abc'"),
        ("temperature", True, "temperature must be a number"),
        ("top_k", 1.5, "top_k must be an integer"),
        ("max_new_tokens", "10", "max_new_tokens must be an integer"),
        ("n", False, "n must be an integer"),
        ("ignore_eos", 1, "ignore_eos must be a boolean"),
        ("stop", 5, "stop must be a string or a list of strings"),
        ("stop", ["a", 3], "stop must be a string or a list of strings"),
        ("stop_token_ids", [1, "2"], "stop_token_ids must be a list of integers"),
        ("seed", "x", "seed must be an integer"),
        ("logit_bias", {"abc": 1.0}, "logit_bias keys must be token ids"),
        ("logit_bias", {"3": "big"}, "logit_bias values must be numbers"),
    ],
)
def test_from_dict_type_errors(key, value, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams.from_dict({key: value})


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2**20 + 1}, "max_new_tokens"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
        ({"n": 0}, "n must"),
        ({"n": 65}, "n must"),
        ({"stop_token_ids": [5, 100]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop": ""}, "stop strings"),
        ({"stop": ["ok", ""]}, "stop strings"),
        ({"logit_bias": {"200": 1.0}}, "logit_bias"),
        ({"logit_bias": {"2": 150.0}}, "logit_bias"),
    ],
)
def test_verify_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs).verify(vocab_size=100)


def test_verify_accepts_edges():
    SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=1,
        min_p=1.0,
        frequency_penalty=-2.0,
        presence_penalty=2.0,
        repetition_penalty=2.0,
        max_new_tokens=0,
        n=64,
        stop_token_ids=[99],
        stop=["x"],
    ).verify(vocab_size=100)
    SamplingParams(stop_token_ids=[10**6]).verify()  # no vocab known: only negatives are rejected


class _FakeTokenizer:
    def encode(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        return list(range(len(text.split())))


def test_normalize_stop_and_greedy():
    p = SamplingParams(stop="hello world", temperature=1e-8, top_k=40).normalize()
    assert p.stop == ["hello world"] and p.stop_token_ids == []
    assert p.top_k == 1 and p.temperature == 1.0 and p.is_greedy
    assert p.stop_str_max_len == len("hello world")
    p2 = SamplingParams(stop=["a b c", "d"], stop_token_ids=[3, 3, 4]).normalize(_FakeTokenizer())
    assert p2.stop_str_max_len == 3 and p2.stop_token_ids == [3, 4]
    assert not p2.is_greedy
    assert p2.normalize(_FakeTokenizer()).stop == ["a b c", "d"]  # idempotent


def test_is_greedy_and_round_trip():
    assert SamplingParams(top_k=1, temperature=0.7).is_greedy
    assert SamplingParams(temperature=0.0).is_greedy
    p = SamplingParams.from_dict({"temperature": 0.5, "stop": ["x"], "logit_bias": {5: 2}})
    assert p.logit_bias == {"5": 2.0}
    assert SamplingParams.from_dict(p.to_dict()) == p
