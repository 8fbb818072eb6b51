"""DeepSeek-V3.2 (DSA) under context parallelism with several ragged prompts submitted at once, so
they are batched and chunked together (chunk 16): fresh prompts of 1 to 77 tokens whose chunks
end at every offset, including 1-token tails and 1-token prompts (decode-like replicated queries
whose keys all live on one cp rank) in the same step as sparse extends; then radix hits whose
rest is a single token, beside fresh prompts; 8 greedy tokens each (decodes split over the ranks
beside later chunks).

cp 2 (zigzag and round-robin, float32, the default backend and `dsa`) vs cp 1: greedy ids
identical, the logprob of every sampled token within 1e-4. Regression test for the crash in
`mla_cp._decode_topk` on some chunk splits (a cp rank storing no key of any decode-like query of
a sparse step: the `dsa` op's candidates were indexed by an empty position list, the reference
path viewed 0 index keys as [n, 0, -1])."""

from __future__ import annotations

import os

import pytest

import sglang as sgl
from sglang.test.tiny_models import ASSETS_DIR

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

NEW_TOKENS = 8
TOL = 1e-4
ENGINE = dict(
    model_path=os.path.join(ASSETS_DIR, "tiny-deepseek-v32"),
    load_format="dummy",
    dtype="float32",
    chunked_prefill_size=16,
    max_total_tokens=4096,
    num_threads=1,
    log_level="warning",
)
# a 1-token prompt first: it enters beside the first chunk of the next prompt alone (no other
# decode), so cp rank 1 stores no key of any decode-like query of that sparse step
FIRST = [[7], list(range(5, 5 + 77)), [40, 41, 42], list(range(100, 131)), list(range(200, 217)), [9, 8]]
# radix hits of the first round with one or two new tokens, beside fresh prompts of 33 and 1 tokens
SECOND = [[11], FIRST[1] + [300], FIRST[3] + [301], list(range(400, 433)), FIRST[4] + [302, 303], [12]]
CONFIGS = {
    "zigzag": dict(),
    "zigzag-dsa": dict(attention_backend="dsa"),
    "round-robin-dsa": dict(attention_backend="dsa", cp_strategy="round-robin"),
}


def _run(**kwargs) -> list[dict]:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(**ENGINE, **kwargs) as llm:
        outs = []
        for batch in (FIRST, SECOND):
            outs += llm.generate(input_ids=batch, sampling_params=params, return_logprob=True)
    return outs


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return _run()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dsa_cp2_concurrent_ragged_prompts_match_cp1(reference, name):
    got = _run(cp_size=2, **CONFIGS[name])
    assert len(got) == len(reference) == len(FIRST) + len(SECOND)
    assert len({tuple(r["output_ids"]) for r in reference}) > 3  # not degenerate
    for i, (r, g) in enumerate(zip(reference, got)):
        assert len(g["output_ids"]) == NEW_TOKENS and g["output_ids"] == r["output_ids"], (name, i)
        ref_lp = [e[0] for e in r["meta_info"]["output_token_logprobs"]]
        got_lp = [e[0] for e in g["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ref_lp, got_lp)) <= TOL, (name, i)
