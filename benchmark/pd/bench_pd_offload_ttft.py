"""PD + HiCache: time to first token of a conversation's turn 2 with vs without the decode side's
offloaded answer (`--disaggregation-decode-enable-offload-kvcache`, issue 31).

SmolLM2-135M (float32, the default model's weights), one thread per server, Mooncake over TCP,
requests sent as sglang-router sends them (the same room to both servers). One prefill server
with `--enable-hierarchical-cache --hicache-storage-backend file`, two decode servers on the same
L3 directory: one with the offload flag, one without. Per configuration, a fresh conversation:
turn 1 (a `--prompt`-token prompt, a `--answer`-token greedy answer), then the prefill server's
L1 / L2 are flushed (the prefix evicted, as under load or after a restart) and turn 2 (turn 1's
prompt + answer + `--new` tokens, max_new_tokens=1: its wall time is the TTFT) is timed:

- offload:    the decode side wrote turn 1's pages (prompt and answer): the prefill loads them
              and computes only the new text (and the answer's last token);
- no offload: L3 holds only the prefill server's own pages (turn 1's prompt): it computes the
              answer and the new text;
- recompute:  L3 cleared too: the whole turn 2 is computed.

Each row checks and prints the prefill tokens computed and L3 tokens loaded (server counters).

    python benchmark/pd/bench_pd_offload_ttft.py [--prompt 2048] [--answer 256] [--new 64]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import httpx

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "disaggregation")
)
from pd_helpers import launch, post_pair, wait_kv_restored  # noqa: E402

SP = 64  # tokens per storage page


def body(ids: list[int], n: int) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def run_pd(prefill, decode, ids: list[int], n: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    _, out = post_pair(prefill, decode, body(ids, n), timeout=600)
    elapsed = time.perf_counter() - t0
    assert "output_ids" in out, out
    wait_kv_restored(prefill, 120)
    wait_kv_restored(decode, 120)
    return out["output_ids"], elapsed


def conversation(prefill, decode, args, seed: int, clear_l3: bool) -> dict:
    rng = random.Random(seed)
    turn1 = [rng.randrange(3, 49000) for _ in range(args.prompt)]
    answer, _ = run_pd(prefill, decode, turn1, args.answer)
    assert httpx.post(prefill.url + "/flush_cache", timeout=30).status_code == 200
    if clear_l3:
        assert httpx.post(prefill.url + "/clear_hicache_storage_backend", timeout=30).status_code == 200
    turn2 = turn1 + answer + [rng.randrange(3, 49000) for _ in range(args.new)]
    before = prefill.state()
    _, ttft = run_pd(prefill, decode, turn2, 1)
    after = prefill.state()
    return {
        "ttft_s": ttft,
        "turn2_tokens": len(turn2),
        "computed": after["prefill_tokens_computed"] - before["prefill_tokens_computed"],
        "l3_loaded": after["hicache_l3_hit_tokens"] - before["hicache_l3_hit_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--answer", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    from sglang.test.prompt_logprobs_reference import smollm2_hf_dir

    common = ["--model-path", smollm2_hf_dir(), "--dtype", "float32", "--num-threads", "1"]
    common += ["--max-total-tokens", str(2 * (args.prompt + args.answer + args.new) + 512)]
    with tempfile.TemporaryDirectory() as l3:
        extra = json.dumps({"file_path": l3, "page_tokens": SP})
        storage = ["--hicache-storage-backend", "file", "--hicache-storage-backend-extra-config", extra]
        servers = []
        try:
            prefill = launch([*common, "--enable-hierarchical-cache", *storage], "bench-prefill", "prefill")
            servers.append(prefill)
            offload = launch(
                [*common, "--disaggregation-decode-enable-offload-kvcache", *storage],
                "bench-decode-off",
                "decode",
            )
            servers.append(offload)
            plain = launch(common, "bench-decode", "decode")
            servers.append(plain)
            rows = {
                "offload": conversation(prefill, offload, args, 1, clear_l3=False),
                "no offload": conversation(prefill, plain, args, 2, clear_l3=False),
                "recompute": conversation(prefill, plain, args, 3, clear_l3=True),
            }
        finally:
            for s in reversed(servers):
                s.stop()
    base = rows["recompute"]["ttft_s"]
    print(f"turn 1: {args.prompt} prompt + {args.answer} answer tokens; turn 2 adds {args.new} new tokens")
    print(f"{'turn 2':<12} {'TTFT (s)':>9} {'computed':>9} {'L3 loaded':>10} {'recompute / row':>16}")
    for name, r in rows.items():
        print(
            f"{name:<12} {r['ttft_s']:>9.3f} {r['computed']:>9} {r['l3_loaded']:>10} {base / r['ttft_s']:>15.2f}x"
        )


if __name__ == "__main__":
    main()
