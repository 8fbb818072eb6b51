"""PD with `--kv-cache-dtype fp8_e4m3` on both servers (Mooncake over TCP, tiny Llama and tiny
DeepSeek-V3.2 on the `dsa` backend, float32 dummy weights): the prefill server's 1-byte KV (for
V3.2: the MLA latent rows and the indexer's keys, each with its scales) lands in the decode
server's 1-byte pool as stored,
and the greedy ids equal the in-process single-rank scheduler's with the same FP8 cache (the same
rounding: the decode side reads back exactly the bytes the prefill side wrote). Both servers
report the cache in /get_server_info."""

from __future__ import annotations

import httpx
import pytest

from pd_helpers import TINY_DSV32, TINY_LLAMA, dummy_args, launch, post_pair, wait_kv_restored
from sglang.test.scheduler_harness import SchedulerHarness

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

NEW_TOKENS = 8
PROMPTS = [list(range(5, 5 + 40)), [40, 41, 42]]
FLAGS = ["--kv-cache-dtype", "fp8_e4m3"]


@pytest.mark.parametrize(
    "model, extra",
    [(TINY_LLAMA, {}), (TINY_DSV32, {"attention_backend": "dsa"})],
    ids=["llama", "dsv32-dsa"],
)
def test_pd_pair_with_fp8_kv_matches_single_rank(model, extra):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
    common = [*dummy_args(model, 1024), *FLAGS, *flags]
    prefill = launch(common, "fp8kv-prefill", mode="prefill")
    try:
        decode = launch(common, "fp8kv-decode", mode="decode")
        try:
            for server in (prefill, decode):
                info = httpx.get(server.url + "/get_server_info", timeout=30).json()
                assert info["kv_cache_dtype"] == "fp8_e4m3"
                assert info["internal_states"][0]["kv_cache_storage_dtype"] == "float8_e4m3fn"
            params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
            outs = [post_pair(prefill, decode, {"input_ids": p, "sampling_params": params}) for p in PROMPTS]
            ref = SchedulerHarness(
                model_path=model,
                load_format="dummy",
                max_total_tokens=1024,
                kv_cache_dtype="fp8_e4m3",
                **extra,
            )
            rids = [ref.submit(p, NEW_TOKENS) for p in PROMPTS]
            ref.run()
            assert [d.get("output_ids") for _, d in outs] == [ref.outputs[r] for r in rids], outs
            wait_kv_restored(decode, 20)
        finally:
            decode.stop()
    finally:
        prefill.stop()
