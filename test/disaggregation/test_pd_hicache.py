"""HiCache through PD (tiny Llama, dummy float32 weights, Mooncake over TCP; requests sent as
sglang-router sends them, the same room to both servers): a prefill server with
--enable-hierarchical-cache and a decode server with --disaggregation-decode-enable-offload-kvcache
share one L3 store (16-token storage pages): a `file` directory, then a Mooncake store (a
`mooncake_master` and a store service started by the test). One module: a colocated reference
without any prefix cache starts once, the prefill / decode pair once per backend.

* a long prefix flushed from the prefill server's L1 / L2 is loaded from L3: the prefill computes
  only the suffix (its counters), the tokens are the reference's;
* turn 2 of a conversation (turn 1's prompt + its answer + new text): the pages of the answer were
  written by the decode server, so the prefill computes only the new text (and the answer's last
  token, whose KV the decode never computed); tokens are the reference's;
* (`file`) every page corrupted: the prefill reads a bad page, counts it, recomputes everything, the tokens
  are the reference's; both servers' KV back to free;
* the store gone (the directory replaced by a file; the Mooncake master killed): the decode side's
  writes and the prefill side's reads / writes fail, counted; every answer is the reference's and
  the prefill computes everything.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from pd_helpers import TINY_LLAMA, dummy_args, launch, post_pair, wait_kv_restored

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SP = 16  # tokens per storage page


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 550) for _ in range(n)]


@pytest.fixture(scope="module")
def reference():
    ref = launch([*dummy_args(TINY_LLAMA, 2048), "--disable-radix-cache"], "hc-colocated")
    yield ref
    ref.stop()


def _file_l3(root: Path) -> list[str]:
    """The flags of a `file` L3 in `root` with SP-token pages (both servers take the same)."""
    extra = json.dumps({"file_path": str(root), "page_tokens": SP})
    return [
        *("--hicache-storage-backend", "file", "--hicache-storage-backend-extra-config", extra),
        *("--hicache-storage-prefetch-policy", "wait_complete"),  # every stored page before admission
    ]


@contextlib.contextmanager
def _l3(backend: str, root: Path):
    """The storage flags of both servers and a function that breaks the store (the store: a
    directory, or a `mooncake_master` with a store service lending the memory, stopped afterwards)."""
    if backend == "file":

        def break_dir() -> None:  # the directory replaced by a file: every write and read fails
            shutil.rmtree(root)
            root.write_text("not a directory")

        yield _file_l3(root), break_dir
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hicache"))
    from mooncake_helpers import MooncakeMaster

    master = MooncakeMaster(root)
    service = master.store_service()  # the servers lend no memory: pages outlive them
    closed = []

    def kill_master() -> None:
        service.close()
        closed.append(True)
        master.kill()

    try:
        flags = ["--hicache-storage-backend", "mooncake", "--hicache-storage-backend-extra-config"]
        policy = ["--hicache-storage-prefetch-policy", "wait_complete"]
        yield [*flags, master.extra_config(SP), *policy], kill_master
    finally:
        if not closed:
            service.close()
        master.kill()


@pytest.fixture(scope="module", params=["file", "mooncake"])
def stack(request, reference, tmp_path_factory):
    backend = request.param
    root = tmp_path_factory.mktemp(f"l3-{backend}")
    common = dummy_args(TINY_LLAMA, 2048)
    started = []
    with _l3(backend, root) as (storage, break_store):
        try:
            prefill_args = [*common, "--enable-hierarchical-cache", *storage, "--chunked-prefill-size", "64"]
            started.append(launch(prefill_args, f"hc-{backend}-prefill", mode="prefill"))
            decode_args = [*common, "--disaggregation-decode-enable-offload-kvcache", *storage]
            started.append(launch(decode_args, f"hc-{backend}-decode", mode="decode"))
            yield {
                "ref": reference,
                "prefill": started[0],
                "decode": started[1],
                "l3": root,
                "backend": backend,
                "break_store": break_store,
            }
        finally:
            for p in reversed(started):
                p.stop()


def _body(ids: list[int], n: int) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def _reference(stack, ids: list[int], n: int) -> list[int]:
    r = httpx.post(stack["ref"].url + "/generate", json=_body(ids, n), timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def _pd(stack, ids: list[int], n: int) -> list[int]:
    p_out, d_out = post_pair(stack["prefill"], stack["decode"], _body(ids, n))
    assert "output_ids" in d_out, (p_out, d_out)
    wait_kv_restored(stack["prefill"], 60)  # released (and written through to L3) on the prefill
    wait_kv_restored(stack["decode"], 60)
    return d_out["output_ids"]


def _flush_prefill(stack) -> None:
    r = httpx.post(stack["prefill"].url + "/flush_cache", timeout=30)
    assert r.status_code == 200, r.text


def _delta(before: dict, after: dict, key: str) -> int:
    return after[key] - before[key]


def test_prefix_flushed_from_the_prefill_is_loaded_from_l3(stack):
    rng = random.Random(1)
    prefix = _ids(rng, 10 * SP)
    first, second = prefix + _ids(rng, 12), prefix + _ids(rng, 9)
    assert _pd(stack, first, 4) == _reference(stack, first, 4)
    _flush_prefill(stack)  # L1 and L2 emptied: only L3 holds the prefix now
    before = stack["prefill"].state()
    got = _pd(stack, second, 4)
    after = stack["prefill"].state()
    assert _delta(before, after, "hicache_l3_hit_tokens") == len(prefix), after
    assert _delta(before, after, "prefill_tokens_computed") == len(second) - len(prefix), after
    assert got == _reference(stack, second, 4)


def test_turn_two_loads_the_answer_the_decode_side_offloaded(stack):
    _check_turn_two(stack, seed=2)


def test_turn_two_at_tp2(reference, tmp_path):
    """Both servers at tp 2: each rank writes and reads the pages of its heads."""
    storage = [*_file_l3(tmp_path), "--tp-size", "2"]
    common = dummy_args(TINY_LLAMA, 2048)
    started = []
    try:
        started.append(
            launch([*common, "--enable-hierarchical-cache", *storage], "hc-tp2-prefill", mode="prefill")
        )
        decode_args = [*common, "--disaggregation-decode-enable-offload-kvcache", *storage]
        started.append(launch(decode_args, "hc-tp2-decode", mode="decode"))
        _check_turn_two({"ref": reference, "prefill": started[0], "decode": started[1]}, seed=5)
    finally:
        for p in reversed(started):
            p.stop()
    assert len(list(tmp_path.iterdir())) == 2  # one namespace folder per tp rank, shared by both servers


def test_prefill_pp2_loads_the_prefix_on_every_stage(reference, tmp_path):
    """A prefill server at pp 2: a prefix flushed from L1 / L2 is loaded from L3 by both stages
    (each its layers' pages), and each stage sends its layers' KV, the loaded prefix included."""
    storage = [*_file_l3(tmp_path), "--pp-size", "2", "--chunked-prefill-size", "64"]
    common = dummy_args(TINY_LLAMA, 2048)
    started = []
    try:
        started.append(
            launch([*common, "--enable-hierarchical-cache", *storage], "hc-pp2-prefill", mode="prefill")
        )
        started.append(launch(common, "hc-pp2-decode", mode="decode"))
        stack = {"ref": reference, "prefill": started[0], "decode": started[1]}
        rng = random.Random(6)
        prefix = _ids(rng, 10 * SP)
        first, second = prefix + _ids(rng, 12), prefix + _ids(rng, 9)
        assert _pd(stack, first, 8) == _reference(stack, first, 8)
        _flush_prefill(stack)
        before = stack["prefill"].state()
        assert _pd(stack, second, 8) == _reference(stack, second, 8)
        after = stack["prefill"].state()
    finally:
        for p in reversed(started):
            p.stop()
    assert _delta(before, after, "hicache_l3_hit_tokens") == len(prefix), after
    assert _delta(before, after, "prefill_tokens_computed") == len(second) - len(prefix), after
    assert after["hicache_peer_missing_pages"] == 0 and after["hicache_peer_read_failures"] == 0, after


def _check_turn_two(stack, seed: int) -> None:
    """Turn 1 through the pair, then turn 2 = turn 1 + its answer + new text: the prefill loads the
    answer's page the decode side wrote and computes only the new text (+ the answer's last token)."""
    rng = random.Random(seed)
    answer_len = 10
    turn1 = _ids(rng, 10 * SP - answer_len + 1)  # prompt + answer (but its last token) = 10 pages
    d_before = stack["decode"].state()
    answer = _pd(stack, turn1, answer_len)
    assert answer == _reference(stack, turn1, answer_len)
    d_after = stack["decode"].state()
    assert _delta(d_before, d_after, "hicache_offload_pages_written") >= 1, d_after  # the answer's page
    assert d_after["hicache_offload_write_failures"] == 0

    new_text = _ids(rng, 12)
    turn2 = turn1 + answer + new_text
    before = stack["prefill"].state()
    got = _pd(stack, turn2, 6)
    after = stack["prefill"].state()
    # L1 holds turn 1's prompt; L3 the rest of the 10 pages, the last one written by the decode side
    assert _delta(before, after, "hicache_l1_hit_tokens") == len(turn1), after
    assert _delta(before, after, "hicache_l3_hit_tokens") == 10 * SP - len(turn1), after
    assert _delta(before, after, "prefill_tokens_computed") == len(new_text) + 1, after
    assert got == _reference(stack, turn2, 6)


def test_corrupted_pages_are_recomputed(stack):
    if stack["backend"] != "file":
        pytest.skip("corrupted Mooncake pages: test/hicache/test_hicache_mooncake_storage.py")
    rng = random.Random(3)
    prompt = _ids(rng, 6 * SP + 5)
    want = _reference(stack, prompt, 4)
    assert _pd(stack, prompt, 4) == want
    pages = [p for p in Path(stack["l3"]).rglob("*.kv")]
    assert pages
    for page in pages:  # flip a payload byte of every page: each fails its checksum
        data = bytearray(page.read_bytes())
        data[-1] ^= 0x5A
        page.write_bytes(bytes(data))
    _flush_prefill(stack)
    before, d_before = stack["prefill"].state(), stack["decode"].state()
    assert _pd(stack, prompt, 4) == want
    after, d_after = stack["prefill"].state(), stack["decode"].state()
    assert _delta(before, after, "hicache_storage_read_failures") >= 1, after
    assert _delta(before, after, "hicache_l3_hit_tokens") == 0, after
    assert _delta(before, after, "prefill_tokens_computed") == len(prompt), after
    # the bad page read is removed and written again: by the prefill at its insert, or first by the
    # decode side's offload of the finished request (both write what the store lacks; they race)
    rewritten = _delta(before, after, "hicache_storage_pages_written")
    rewritten += _delta(d_before, d_after, "hicache_offload_pages_written")
    assert rewritten >= 1, (after, d_after)
    assert len(list(Path(stack["l3"]).rglob("*.kv"))) == len(pages)


def test_store_gone_on_both_sides_recomputes(stack):
    """Last of a backend's tests (it breaks the store): the decode side's writes and the prefill
    side's reads and writes fail, are counted, and every request is answered correctly."""
    rng = random.Random(4)
    prompt = _ids(rng, 6 * SP + 5)
    want = _reference(stack, prompt, 6)
    stack["break_store"]()
    d_before, p_before = stack["decode"].state(), stack["prefill"].state()
    assert _pd(stack, prompt, 6) == want  # turn 1: nothing can be written
    d_after = stack["decode"].state()
    assert _delta(d_before, d_after, "hicache_offload_write_failures") >= 1, d_after
    assert _delta(d_before, d_after, "hicache_offload_pages_written") == 0, d_after
    _flush_prefill(stack)
    assert _pd(stack, prompt + answer_stub(want), 2) == _reference(stack, prompt + answer_stub(want), 2)
    p_after = stack["prefill"].state()
    assert _delta(p_before, p_after, "hicache_storage_write_failures") >= 1, p_after
    assert _delta(p_before, p_after, "hicache_l3_hit_tokens") == 0, p_after
    assert _delta(p_before, p_after, "prefill_tokens_computed") == 2 * len(prompt) + len(want) - 1, p_after


def answer_stub(answer: list[int]) -> list[int]:
    """Turn 1's answer but its last token (a turn 2 whose whole history would have been offloaded)."""
    return answer[:-1]
