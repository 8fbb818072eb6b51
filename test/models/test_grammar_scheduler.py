"""Constrained requests through the whole in-process scheduler (tiny Llama, dummy float32 weights,
its 552-token tokenizer): mixed with unconstrained ones, chunked prefill, and a pool too small for
all at once, so requests are retracted and re-prefilled: every output matches its regex, the
tokens equal a run with room for everything, and no matcher or KV slot is left behind."""

from __future__ import annotations

import re

import torch

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.tiny_models import TINY_LLAMA_DIR

REGEXES = [r"[a-z]{20}", r"(ab|cd){10}", None, r"[0-9]{18}"]


def run(max_total_tokens: int) -> tuple[dict, Scheduler]:
    tokenizer = get_tokenizer(str(TINY_LLAMA_DIR))
    args = ServerArgs(
        model_path=str(TINY_LLAMA_DIR),
        load_format="dummy",
        dtype="float32",
        num_threads=1,
        max_total_tokens=max_total_tokens,
        chunked_prefill_size=16,
        disable_radix_cache=True,
    )
    args.validate()
    sched = Scheduler(args, tokenizer=tokenizer)
    g = torch.Generator().manual_seed(3)
    for i, regex in enumerate(REGEXES):
        prompt = torch.randint(3, 500, (30 + 5 * i,), generator=g).tolist()
        params = SamplingParams(max_new_tokens=24, temperature=0.0, regex=regex, ignore_eos=regex is None)
        sched.handle_message(TokenizedGenerateReqInput(f"r{i}", None, prompt, params))
    outs: dict = {}
    for out in sched.run_until_idle():
        for i, rid in enumerate(out.rids):
            outs.setdefault(rid, []).extend(out.new_output_ids[i])
    return {rid: tokenizer.decode(ids, skip_special_tokens=True) for rid, ids in outs.items()}, sched


def test_constrained_requests_survive_retraction():
    roomy, _ = run(4096)
    tight, sched = run(96)
    assert sched.num_retractions > 0, "the pool was meant to force a retraction"
    assert tight == roomy
    for i, regex in enumerate(REGEXES):
        if regex is not None:
            assert re.fullmatch(regex, roomy[f"r{i}"]), (regex, roomy[f"r{i}"])
    state = sched.internal_state()
    assert state["grammar_matchers"] == 0 and state["grammar_queue"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
