"""Prompt logprobs (`logprob_start_len`, `top_logprobs_num`, `token_ids_logprob`) through the
in-process scheduler on the SmolLM2 weights in float32, against transformers' float32 forward
(within 2e-3): whole prompts and chunked prefill (several chunks), with and without a radix hit,
prompt only (`max_new_tokens: 0`) and with an output token; and `stop_regex`."""

from __future__ import annotations

import re

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test import prompt_logprobs_reference as plr

TOKEN_IDS = [11, 504, 3575]


class Driver:
    """The scheduler in-process; each request's BatchTokenIDOut fields collected by rid."""

    def __init__(self, tokenizer=None, **kw):
        args = ServerArgs(
            model_path=plr.smollm2_hf_dir(), dtype="float32", num_threads=1, max_total_tokens=2048, **kw
        )
        args.validate()
        self.scheduler = Scheduler(args, tokenizer=tokenizer)
        self.out: dict[str, dict] = {}
        self._n = 0

    def submit(self, prompt, start: int, max_new_tokens: int = 0, top: int = 0, ids=None, **params) -> str:
        rid = f"r{self._n}"
        self._n += 1
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **params)
        self.scheduler.handle_message(
            TokenizedGenerateReqInput(
                rid,
                None,
                list(prompt),
                sp,
                return_logprob=True,
                top_logprobs_num=top,
                logprob_start_len=start,
                token_ids_logprob=ids,
            )
        )
        self.out[rid] = {"ids": [], "output_token_logprobs": [], "input": None, "output_ids_lp": []}
        return rid

    def run(self) -> None:
        for msg in self.scheduler.run_until_idle():
            for i, rid in enumerate(msg.rids):
                got = self.out[rid]
                got["ids"] += msg.new_output_ids[i]
                got["output_token_logprobs"] += msg.output_token_logprobs[i] or []
                got["output_ids_lp"] += msg.output_token_ids_logprobs[i] or []
                got["cached"] = msg.cached_tokens[i]
                got["finish"] = msg.finished_reasons[i]
                if msg.input_logprobs[i] is not None:
                    assert got["input"] is None, "prompt logprobs sent twice"
                    got["input"] = msg.input_logprobs[i]


@pytest.fixture(scope="module")
def ref():
    prompt = list(plr.prompt_ids())
    assert len(prompt) > 20
    return prompt, plr.reference(prompt)


@pytest.mark.parametrize("chunk", [-1, 8], ids=["whole", "chunked8"])
def test_prompt_logprobs_match_transformers(ref, chunk):
    prompt, lsm = ref
    n = len(prompt)
    d = Driver(chunked_prefill_size=chunk, page_size=1)
    starts = [0, 1, n - 2]
    rids = [d.submit(prompt, s, max_new_tokens=0 if s else 1, top=3, ids=TOKEN_IDS) for s in starts]
    d.run()
    for s, rid in zip(starts, rids):
        got = d.out[rid]
        assert got["finish"]["type"] == "length"
        plr.check_entries(got["input"].token_logprobs, prompt, s, lsm, f"start {s}")
        plr.check_top(got["input"].top_logprobs, s, lsm, 3, f"start {s}")
        plr.check_token_ids(got["input"].token_ids_logprobs, s, lsm, TOKEN_IDS, f"start {s}")
    first = d.out[rids[0]]
    want_lp, want_id = plr.output_logprob(lsm)
    assert first["ids"] == [want_id]
    assert abs(first["output_token_logprobs"][0][0] - want_lp) <= plr.TOL
    assert [e[1] for e in first["output_ids_lp"][0]] == TOKEN_IDS
    assert d.out[rids[1]]["ids"] == [] and d.out[rids[1]]["output_token_logprobs"] == []
    if chunk > 0:  # each prompt ran in several chunks: its rows were collected across them
        assert d.scheduler.forward_ct >= -(-n // chunk)


@pytest.mark.parametrize("chunk", [-1, 8], ids=["whole", "chunked8"])
def test_radix_hit_still_gives_prompt_logprobs(ref, chunk):
    prompt, lsm = ref
    n = len(prompt)
    d = Driver(chunked_prefill_size=chunk, page_size=1)
    d.submit(prompt, -1, max_new_tokens=1)  # caches the whole prompt
    d.run()
    warm = d.submit(prompt, n - 2)
    d.run()
    full = d.submit(prompt, 0)
    d.run()
    late = d.out[warm]
    plr.check_entries(late["input"].token_logprobs, prompt, n - 2, lsm, "radix, start n-2")
    assert late["cached"] == n - 3  # the cache seeds everything before the first needed row
    plr.check_entries(d.out[full]["input"].token_logprobs, prompt, 0, lsm, "radix, start 0")
    assert d.out[full]["cached"] == 0


def test_no_prompt_logprobs_by_default(ref):
    prompt, _ = ref
    d = Driver()
    rid = d.submit(prompt, -1, max_new_tokens=2)
    d.run()
    assert d.out[rid]["input"] is None and len(d.out[rid]["output_token_logprobs"]) == 2


def test_stop_regex_honoured_and_empty_accepted(ref):
    from transformers import AutoTokenizer

    prompt, _ = ref
    tok = AutoTokenizer.from_pretrained(plr.smollm2_hf_dir(), local_files_only=True)
    d = Driver(tokenizer=tok)
    free = d.submit(prompt, -1, max_new_tokens=8)
    d.run()
    text = tok.decode(d.out[free]["ids"])
    word = re.search(r"\w+", text).group(0)  # the greedy answer's first word ("Rome")
    stopped = d.submit(prompt, -1, max_new_tokens=8, stop_regex=[r"\b" + word[0] + r"\w+"])
    empty = d.submit(prompt, -1, max_new_tokens=8, stop_regex=[])
    d.run()
    assert d.out[stopped]["finish"] == {"type": "stop", "matched": word}
    assert len(d.out[stopped]["ids"]) < 8
    assert d.out[empty]["ids"] == d.out[free]["ids"]
    assert SamplingParams.from_dict({"stop_regex": []}).normalize().stop_regex == []
    assert SamplingParams.from_dict({"stop_regex": None}).normalize().stop_regex == []
    assert SamplingParams.from_dict({"stop_regex": "a+"}).normalize().stop_regex == ["a+"]
    with pytest.raises(ValueError, match="stop_regex"):
        SamplingParams.from_dict({"stop_regex": "("}).verify()
