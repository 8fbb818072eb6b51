"""GrammarManager (constrained/): the grammar queue, compile cache, bitmask, termination, release and
the mirrored ranks' agreement, with real xgrammar on the tiny Llama's tokenizer (552 tokens)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from sglang.srt.constrained.factory import create_grammar_manager
from sglang.srt.constrained.grammar_spec import (
    ANY_JSON,
    GrammarError,
    GrammarSpec,
    response_format_params,
    spec_of,
    validate_spec,
)
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo, unpack_bitmask
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

TINY = str(Path(__file__).resolve().parents[2] / "python" / "sglang" / "test" / "assets" / "tiny-llama")
VOCAB, EOS = 552, 2


class FakeReq:
    def __init__(self, rid: str, **params):
        self.rid = rid
        self.sampling_params = SamplingParams(**params)
        self.output_ids: list[int] = []
        self.finished_reason = None


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(TINY)


def manager(tokenizer, group=None):
    return create_grammar_manager("xgrammar", tokenizer, VOCAB, [EOS], group)


def poll_until(mgr, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    ready, failed = [], []
    while mgr.busy and time.monotonic() < deadline:
        r, f = mgr.poll(block=True)
        ready += r
        failed += f
    return ready, failed


def allowed(mgr, req) -> set[int]:
    mask = mgr.fill_mask([req])
    return set(torch.nonzero(unpack_bitmask(mask, VOCAB)[0]).view(-1).tolist())


def test_queue_then_cache_hit(tokenizer):
    mgr = manager(tokenizer)
    a, b = FakeReq("a", regex="ab"), FakeReq("b", regex="ab")
    assert mgr.route([a]) == [] and mgr.busy  # compiling: held in the grammar queue
    assert poll_until(mgr) == ([a], [])
    assert mgr.backend.misses == 1
    assert mgr.route([b]) == [b]  # compiled once: the second request goes straight on
    assert mgr.backend.hits == 1
    assert mgr.internal_state() == {"grammar_queue": 0, "grammar_matchers": 2, "jump_forward_tokens": 0}
    plain = FakeReq("c")
    assert mgr.route([plain]) == [plain] and mgr.fill_mask([plain]) is None


def test_mask_termination_and_release(tokenizer):
    mgr = manager(tokenizer)
    req = FakeReq("r", regex="ab")
    mgr.route([req])
    poll_until(mgr)
    a, b = tokenizer.encode("a")[0], tokenizer.encode("b")[0]
    assert a in allowed(mgr, req) and b not in allowed(mgr, req) and EOS not in allowed(mgr, req)
    for token in (a, b):
        req.output_ids.append(token)
        mgr.on_token(req, token)
        assert req.finished_reason is None
    assert allowed(mgr, req) == {EOS}  # the grammar is complete: only its stop token remains
    mgr.on_token(req, EOS)
    assert req.finished_reason == {"type": "stop", "matched": EOS}
    mgr.release(req)
    assert mgr.internal_state()["grammar_matchers"] == 0


def test_disallowed_token_finishes_with_an_error(tokenizer):
    mgr = manager(tokenizer)
    req = FakeReq("r", regex="ab")
    mgr.route([req])
    poll_until(mgr)
    mgr.on_token(req, tokenizer.encode("b")[0])
    assert req.finished_reason["type"] == "abort" and "not allowed" in req.finished_reason["message"]


def test_compile_error_fails_the_request_with_400(tokenizer):
    mgr = manager(tokenizer)
    bad = FakeReq("bad", regex="a(")
    assert mgr.route([bad]) == []
    ready, failed = poll_until(mgr)
    assert ready == [] and failed == [bad]
    assert bad.finished_reason["status_code"] == 400 and "invalid regex" in bad.finished_reason["message"]


def test_abort_from_the_queue_and_catch_up(tokenizer):
    mgr = manager(tokenizer)
    held = FakeReq("h", json_schema=json.dumps({"type": "object"}))
    mgr.route([held])
    assert mgr.abort("h") == [held] and not mgr.busy
    # PD decode: the matcher is attached on arrival and advanced over the prefill side's token
    pd = FakeReq("pd", regex="ab")
    mgr.prepare(pd)
    pd.output_ids = [tokenizer.encode("a")[0]]
    mgr.catch_up(pd)
    assert allowed(mgr, pd) == {tokenizer.encode("b")[0]}


class SlowRank:
    """The replica group as seen when another rank's compile has not finished: MIN gives 0."""

    size = 2
    device = torch.device("cpu")

    def __init__(self):
        self.calls = 0

    def all_reduce(self, t, op="sum"):
        assert op == "min"
        self.calls += 1
        t.zero_()
        return t


def test_ranks_agree_on_compile_completion(tokenizer):
    group = SlowRank()
    mgr = manager(tokenizer, group)
    req = FakeReq("r", regex="a+")
    mgr.route([req])
    time.sleep(0.5)  # done here, but not on the other rank
    assert mgr.poll() == ([], []) and mgr.busy and group.calls == 1


def test_backend_none_refuses_by_name(tokenizer):
    mgr = create_grammar_manager("none", tokenizer, VOCAB, [EOS])
    assert "--grammar-backend none" in mgr.refusal(FakeReq("r", regex="a"))
    assert mgr.refusal(FakeReq("r")) is None
    assert "only one" in manager(tokenizer).refusal(FakeReq("r", regex="a", ebnf='root ::= "a"'))


def test_specs_and_response_formats():
    assert spec_of(SamplingParams(regex="a")) == GrammarSpec("regex", "a")
    validate_spec(GrammarSpec("json_schema", ANY_JSON))
    with pytest.raises(GrammarError, match="invalid json_schema"):
        validate_spec(GrammarSpec("json_schema", "{bad"))
    assert response_format_params({"type": "json_object"}) == {"json_schema": '{"type": "object"}'}
    assert response_format_params({"type": "text"}) == {}
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
        "triggers": ["<a>"],
    }
    params = response_format_params(tag)
    validate_spec(GrammarSpec("structural_tag", params["structural_tag"]))


def test_bitmask_applied_after_bias_for_greedy_and_sampled_rows():
    words = (VOCAB + 31) // 32
    mask = torch.zeros(2, words, dtype=torch.int32)
    mask[:, 0] = 1 << 5  # only token 5
    mask[1, 1] = 1 << 0  # row 1 also token 32
    params = [
        SamplingParams(temperature=0.0, logit_bias={"7": 100.0}),
        SamplingParams(temperature=1.0, seed=3),
    ]
    for p in params:
        p.normalize()
    info = SamplingBatchInfo.from_params(params, [[], []], [[1], [1]], VOCAB, vocab_mask=mask)
    assert info.needs_logit_processing
    logits = torch.zeros(2, VOCAB)
    logits[1, 32] = 5.0
    info.process_logits(logits)
    assert logits[0].argmax() == 5 and torch.isinf(logits[0, 7])  # the bias cannot lift a masked token
    assert set(torch.nonzero(torch.isfinite(logits[1])).view(-1).tolist()) == {5, 32}
    bits = unpack_bitmask(torch.tensor([[-1]], dtype=torch.int32), 40)
    assert bits[0, :32].all() and not bits[0, 32:].any()


def test_xgrammar_kernel_and_torch_unpacking_agree():
    g = torch.Generator().manual_seed(0)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, (VOCAB + 31) // 32), dtype=torch.int32, generator=g)
    params = [SamplingParams(temperature=0.0).normalize() for _ in range(3)]
    info = SamplingBatchInfo.from_params(params, [[]] * 3, [[1]] * 3, VOCAB, vocab_mask=mask)
    logits = torch.randn(3, VOCAB, generator=g)
    fast = logits.clone()
    info.apply_vocab_mask(fast)  # xgrammar's kernel (contiguous float32)
    slow = logits.clone().T.contiguous().T  # not contiguous: the torch unpacking
    info.apply_vocab_mask(slow)
    assert torch.equal(torch.isinf(fast), ~unpack_bitmask(mask, VOCAB))
    assert torch.equal(fast, slow)
