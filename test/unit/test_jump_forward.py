"""Jump-forward (--enable-jump-forward): a real xgrammar matcher on SmolLM2's tokenizer. A schema with
long fixed keys forces text; the retokenized ids decode to exactly that text, the matcher stays
consistent with the ids appended (a valid rest of the JSON is accepted), and the scheduler side cuts
a jump at max_new_tokens / a stop string with the matcher rolled back to the cut."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from sglang.srt.constrained.factory import create_grammar_manager
from sglang.srt.constrained.grammar_spec import ANY_JSON, GrammarSpec, to_grammar
from sglang.srt.constrained.jump_forward import retokenize
from sglang.srt.managers.scheduler.jump_forward import jump_forward
from sglang.srt.managers.scheduler.schedule_batch import Req
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

VOCAB = 49152
KEY_A, KEY_B = "customer_full_name", "account_identifier_number"
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {KEY_A: {"type": "string"}, KEY_B: {"type": "integer"}},
        "required": [KEY_A, KEY_B],
        "additionalProperties": False,
    }
)
PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(find_default_model())


def manager(tokenizer, jump: bool = True):
    return create_grammar_manager("xgrammar", tokenizer, VOCAB, [tokenizer.eos_token_id], jump_forward=jump)


def constrained_req(mgr, **params) -> Req:
    params.setdefault("max_new_tokens", 64)
    if "ebnf" not in params:
        params.setdefault("json_schema", SCHEMA)
    req = Req("r", PROMPT, SamplingParams(**params))
    assert mgr.route([req]) == []
    deadline = time.monotonic() + 30
    ready = []
    while not ready and time.monotonic() < deadline:
        ready, failed = mgr.poll(block=True)
        assert not failed
    assert ready == [req]
    return req


def sample(mgr, req: Req, text: str, tokenizer) -> None:
    """Append `text`'s tokens as if sampled (the matcher advanced, the KV of all but the last written)."""
    for token in tokenizer.encode(text, add_special_tokens=False):
        req.append_token(token)
        mgr.on_token(req, token)
    req.kv_len = req.seqlen - 1


def sched_of(mgr, tokenizer):
    return SimpleNamespace(
        grammar=mgr, eos_token_ids={tokenizer.eos_token_id}, tokenizer=tokenizer, context_len=0
    )


def test_forced_key_retokenizes_to_the_same_text(tokenizer):
    mgr = manager(tokenizer)
    req = constrained_req(mgr)
    sample(mgr, req, '{"', tokenizer)
    state = mgr._states[req]
    forced = state.forced()
    assert forced == KEY_A + '"'
    before, n0 = tokenizer.decode(req.output_ids), len(req.output_ids)
    jump_forward(sched_of(mgr, tokenizer), req)
    assert tokenizer.decode(req.output_ids) == before + forced
    assert len(req.output_ids) > n0 + 1 and not req.finished
    assert mgr.internal_state()["jump_forward_tokens"] == len(req.output_ids) - n0
    # the matcher stands after the forced text: a valid rest of the object is accepted, then EOS ends it
    sample(mgr, req, ': "Ann", "', tokenizer)
    assert mgr._states[req].forced() == KEY_B + '"'
    for token in tokenizer.encode(KEY_B + '": 7}', add_special_tokens=False) + [tokenizer.eos_token_id]:
        mgr.on_token(req, token)
        assert req.finished_reason is None or req.finished_reason["type"] == "stop", req.finished_reason
    assert mgr._states[req].terminated


def test_boundary_token_merges_with_forced_text(tokenizer):
    context = tokenizer.encode("Say", add_special_tokens=False)
    tail = tokenizer.encode(" ", add_special_tokens=False)
    new = retokenize(tokenizer, context, tail, "hello world")
    assert new is not None and new[0] != tail[0]  # " " + "hello" is one token
    assert new == tokenizer.encode(" hello world", add_special_tokens=False)
    assert tokenizer.decode(context + new) == "Say hello world"
    assert retokenize(tokenizer, context, tail, "") is None


def test_jump_cut_at_max_new_tokens_rolls_the_matcher_back(tokenizer):
    mgr = manager(tokenizer)
    req = constrained_req(mgr, max_new_tokens=4)
    sample(mgr, req, '{"', tokenizer)
    jump_forward(sched_of(mgr, tokenizer), req)
    assert len(req.output_ids) == 4 and req.finished_reason == {"type": "length", "length": 4}
    text = tokenizer.decode(req.output_ids)
    assert (text + mgr._states[req].forced()) == '{"' + KEY_A + '"'  # the matcher stands at the cut


def test_jump_cut_at_a_stop_string(tokenizer):
    mgr = manager(tokenizer)
    req = constrained_req(mgr, stop=["full"])
    sample(mgr, req, '{"', tokenizer)
    jump_forward(sched_of(mgr, tokenizer), req)
    assert req.finished_reason == {"type": "stop", "matched": "full"}
    text = tokenizer.decode(req.output_ids)
    assert "full" in text and not text.endswith(KEY_A + '"')
    assert (text + mgr._states[req].forced()).startswith('{"' + KEY_A)


def test_logprobs_of_jumped_tokens(tokenizer):
    mgr = manager(tokenizer)
    req = constrained_req(mgr)
    req.return_logprob, req.top_logprobs_num = True, 2
    for token in tokenizer.encode('{"', add_special_tokens=False):
        req.append_token(token, -0.5, [(-0.5, token)])
        mgr.on_token(req, token)
    req.kv_len = req.seqlen - 1
    sampled = list(req.output_ids)
    jump_forward(sched_of(mgr, tokenizer), req)
    n = len(req.output_ids)
    assert n > len(sampled) and len(req.output_token_logprobs) == n and len(req.output_top_logprobs) == n
    assert [t for _, t in req.output_token_logprobs] == req.output_ids
    kept = len(sampled) if req.output_ids[: len(sampled)] == sampled else len(sampled) - 1
    assert all(lp == -0.5 for lp, _ in req.output_token_logprobs[:kept])
    assert all(lp == 0.0 for lp, _ in req.output_token_logprobs[kept:])


def test_off_changes_nothing(tokenizer):
    mgr = manager(tokenizer, jump=False)
    req = constrained_req(mgr)
    sample(mgr, req, '{"', tokenizer)
    out = list(req.output_ids)
    jump_forward(sched_of(mgr, tokenizer), req)
    assert req.output_ids == out and mgr._states[req].forced() == KEY_A + '"'


def test_sampled_token_merged_into_the_forced_text(tokenizer):
    mgr = manager(tokenizer)
    req = constrained_req(mgr, ebnf='root ::= "Say hello world"')
    req.return_logprob, req.top_logprobs_num = True, 1
    for token in tokenizer.encode("Say", add_special_tokens=False) + tokenizer.encode(
        " ", add_special_tokens=False
    ):
        req.append_token(token, -0.5, [(-0.5, token)])
        mgr.on_token(req, token)
    req.kv_len = req.seqlen - 1
    say = tokenizer.encode("Say", add_special_tokens=False)
    jump_forward(sched_of(mgr, tokenizer), req)
    # the sampled " " became part of " hello": replaced, its sampled logprob gone
    assert req.output_ids == say + tokenizer.encode(" hello world", add_special_tokens=False)
    assert [lp for lp, _ in req.output_token_logprobs] == [-0.5] * len(say) + [0.0] * (
        len(req.output_ids) - len(say)
    )
    assert [top for top in req.output_top_logprobs[len(say) :]] == [
        [(0.0, t)] for t in req.output_ids[len(say) :]
    ]
    assert mgr._states[req].forced() == ""
    mgr.on_token(req, tokenizer.eos_token_id)
    assert req.finished_reason == {"type": "stop", "matched": tokenizer.eos_token_id}


def test_flag_refused_without_a_grammar_backend():
    from sglang.srt.server_args import ServerArgs
    from sglang.test.tiny_models import TINY_LLAMA_DIR

    for extra in ({"grammar_backend": "none"}, {"skip_tokenizer_init": True}):
        args = ServerArgs(
            model_path=str(TINY_LLAMA_DIR), load_format="dummy", enable_jump_forward=True, **extra
        )
        with pytest.raises(ValueError, match="--enable-jump-forward needs a grammar backend"):
            args.validate()
    ServerArgs(model_path=str(TINY_LLAMA_DIR), load_format="dummy", enable_jump_forward=True).validate()


def test_disable_any_whitespace_forces_the_separator_with_the_key(tokenizer):
    """--constrained-json-disable-any-whitespace: json.dumps' separators and no other whitespace, so
    after a value the matcher forces `, "<next key>": ` as one string (with any whitespace it stops
    where whitespace could start); json_object (any JSON object / array) follows the same rule."""
    loose = manager(tokenizer)
    strict = create_grammar_manager(
        "xgrammar", tokenizer, VOCAB, [tokenizer.eos_token_id], jump_forward=True, any_whitespace=False
    )
    forced = {}
    for name, mgr in (("loose", loose), ("strict", strict)):
        req = constrained_req(mgr)
        sample(mgr, req, '{"' + KEY_A + '": "Ann"', tokenizer)
        forced[name] = mgr._states[req].forced()
    assert forced["strict"] == ', "' + KEY_B + '": '
    assert forced["loose"] == ""  # whitespace may follow the value
    req = constrained_req(strict, json_schema=ANY_JSON)
    for token in tokenizer.encode('{"a": [1, {"b": null}]}', add_special_tokens=False):
        assert strict._states[req].accept(token), token
    from xgrammar.testing import _is_grammar_accept_string as accepts

    any_json = GrammarSpec("json_schema", ANY_JSON)
    assert accepts(to_grammar(any_json), '{ "a":1 }') and not accepts(
        to_grammar(any_json, False), '{ "a":1 }'
    )
    assert accepts(to_grammar(any_json, False), "[1, 2]") and not accepts(to_grammar(any_json, False), "7")
