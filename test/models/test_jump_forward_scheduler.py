"""Jump-forward (`--enable-jump-forward`) through the whole in-process scheduler (tiny Llama, dummy
float32 weights, its 552-token tokenizer): regexes with long fixed parts beside an unconstrained
request, chunked prefill, and a pool too small for all at once, so requests holding jumped tokens
are retracted and re-prefilled: every output matches its regex, the tokens equal a run with room
for everything, fewer steps than without jump-forward, and an abort right after a jump (its
tokens not yet run through the model) leaves no matcher or KV slot behind."""

from __future__ import annotations

import json
import re

import torch

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.tiny_models import TINY_LLAMA_DIR

REGEXES = [
    r"customer_name: [a-z]{6}; identifier_number: [0-9]{5}",
    r"(ab|cd){10}",
    None,
    r"membership_level: (gold|silver)_member; contact: [a-z]{8}",
]


# the tiny model with dummy weights, chunks of 16 tokens, no prefix cache (every step recomputes)
TINY = dict(model_path=str(TINY_LLAMA_DIR), load_format="dummy", dtype="float32", num_threads=1)


def scheduler(max_total_tokens: int, jump: bool) -> Scheduler:
    args = ServerArgs(
        **TINY,
        max_total_tokens=max_total_tokens,
        chunked_prefill_size=16,
        disable_radix_cache=True,
        enable_jump_forward=jump,
    )
    args.validate()
    sched = Scheduler(args, tokenizer=get_tokenizer(str(TINY_LLAMA_DIR)))
    g = torch.Generator().manual_seed(3)
    for i, regex in enumerate(REGEXES):
        prompt = torch.randint(3, 500, (30 + 5 * i,), generator=g).tolist()
        params = SamplingParams(max_new_tokens=40, temperature=0.0, regex=regex, ignore_eos=regex is None)
        sched.handle_message(TokenizedGenerateReqInput(f"r{i}", None, prompt, params))
    return sched


def run(max_total_tokens: int, jump: bool) -> tuple[dict, Scheduler]:
    sched = scheduler(max_total_tokens, jump)
    outs: dict = {}
    for out in sched.run_until_idle():
        for i, rid in enumerate(out.rids):
            outs.setdefault(rid, []).extend(out.new_output_ids[i])
    return {rid: sched.tokenizer.decode(ids, skip_special_tokens=True) for rid, ids in outs.items()}, sched


def assert_nothing_left(sched: Scheduler) -> None:
    state = sched.internal_state()
    assert state["grammar_matchers"] == 0 and state["grammar_queue"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert state["free_req_slots"] == state["max_req_slots"]


def test_jumped_requests_survive_retraction():
    plain, off = run(4096, jump=False)
    roomy, on = run(4096, jump=True)
    tight, sched = run(110, jump=True)
    assert sched.num_retractions > 0, "the pool was meant to force a retraction"
    assert tight == roomy
    assert on.grammar.jump_forward_tokens > 20 and off.grammar.jump_forward_tokens == 0
    assert on.forward_ct < off.forward_ct
    for i, regex in enumerate(REGEXES):
        if regex is not None:
            assert re.fullmatch(regex, roomy[f"r{i}"]), (regex, roomy[f"r{i}"])
            assert re.fullmatch(regex, plain[f"r{i}"]), (regex, plain[f"r{i}"])
    assert_nothing_left(sched)


def test_abort_right_after_a_jump():
    sched = scheduler(4096, jump=True)
    req = None
    for _ in range(200):
        sched.step()
        req = next((r for r in sched.running if r.rid == "r0" and r.remaining_len > 1 and r.output_ids), None)
        if req is not None:
            break
    assert req is not None, "r0 never jumped"
    sched.handle_message(AbortReq("r0"))
    outs = sched.run_until_idle()
    reasons = {rid: reason for out in outs for rid, reason in zip(out.rids, out.finished_reasons) if reason}
    assert reasons["r0"]["type"] == "abort"
    assert_nothing_left(sched)


def test_disable_any_whitespace_gives_json_dumps_spacing():
    """`--constrained-json-disable-any-whitespace` reaches the scheduler's grammars: the JSON has
    json.dumps' separators and no other whitespace (the dummy model would put whitespace where any
    is allowed), with jump-forward forcing each key and its separators."""
    schema = {
        "type": "object",
        "properties": {
            "level": {"enum": ["gold", "silver"]},
            "n": {"enum": [1, 2, 3]},
            "ok": {"type": "boolean"},
        },
        "required": ["level", "n", "ok"],
        "additionalProperties": False,
    }
    texts = {}
    for strict in (False, True):
        args = ServerArgs(
            **TINY,
            max_total_tokens=2048,
            enable_jump_forward=True,
            constrained_json_disable_any_whitespace=strict,
        )
        args.validate()
        sched = Scheduler(args, tokenizer=get_tokenizer(str(TINY_LLAMA_DIR)))
        params = SamplingParams(max_new_tokens=60, temperature=0.0, json_schema=json.dumps(schema))
        sched.handle_message(TokenizedGenerateReqInput("j", None, [5, 6, 7, 8], params))
        ids = [t for out in sched.run_until_idle() for t in out.new_output_ids[0]]
        texts[strict] = sched.tokenizer.decode(ids, skip_special_tokens=True)
        assert_nothing_left(sched)
    strict = texts[True]
    assert json.dumps(json.loads(strict)) == strict, strict
    assert texts[False] != strict  # the loose grammar let the dummy model choose other whitespace
