"""PD (1 prefill + 1 decode server, Mooncake over TCP, SmolLM2 weights in float32): the prefill
side computes the prompt logprobs, they travel with the first token in the KV handoff's metadata,
and the decode side returns them; values against transformers' float32 forward within 2e-3."""

from __future__ import annotations

import pytest

from pd_helpers import launch, post_pair
from sglang.test import prompt_logprobs_reference as plr

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TOKEN_IDS = [11, 504]


@pytest.fixture(scope="module")
def servers():
    common = ["--model-path", plr.smollm2_hf_dir(), "--dtype", "float32", "--num-threads", "1"]
    started = []
    try:
        started.append(launch([*common, "--chunked-prefill-size", "8"], "prefill", mode="prefill"))
        started.append(launch(common, "decode", mode="decode"))
        yield started
    finally:
        for proc in started:
            proc.stop()


def test_decode_side_returns_the_prefill_sides_prompt_logprobs(servers):
    prefill, decode = servers
    prompt = list(plr.prompt_ids())
    lsm = plr.reference(prompt)
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "token_ids_logprob": TOKEN_IDS,
    }
    _, out = post_pair(prefill, decode, body)
    meta = out["meta_info"]
    plr.check_entries(meta["input_token_logprobs"], prompt, 0, lsm, "pd decode side")
    plr.check_top(meta["input_top_logprobs"], 0, lsm, 2, "pd decode side")
    plr.check_token_ids(meta["input_token_ids_logprobs"], 0, lsm, TOKEN_IDS, "pd decode side")
    want_lp, want_id = plr.output_logprob(lsm)
    assert out["output_ids"][0] == want_id
    assert abs(meta["output_token_logprobs"][0][0] - want_lp) <= plr.TOL
    assert len(meta["output_token_logprobs"]) == 3 and len(meta["output_token_ids_logprobs"]) == 3
