"""SGLang native HTTP API end to end, bad inputs, client disconnects and process life cycle.

The disconnect tests check the scheduler's KV accounting (`available_kv_tokens` from
/get_server_info) returns to its idle value, i.e. an abandoned request really was aborted.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from sglang.srt.managers.tokenizer.incremental_detok import decode_ids
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from server_helpers import (
    API_KEY,
    TINY_LLAMA,
    child_pids,
    flush,
    internal_state,
    launch_server,
    pid_alive,
    wait_idle,
    wait_until,
)

GREEDY = {"temperature": 0.0, "ignore_eos": True}
TOKENIZER = get_tokenizer(TINY_LLAMA)


def _sse_events(lines):
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]


# ---------------------------------------------------------------------------- native /generate
def test_generate_single(client):
    r = client.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 6, **GREEDY}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["output_ids"]) == 6
    assert out["text"] == decode_ids(TOKENIZER, out["output_ids"], True, True)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] == len(TOKENIZER.encode("Hello"))
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["e2e_latency"] > 0 and meta["id"]


def test_generate_batch_and_input_ids(client):
    r = client.post(
        "/generate",
        json={
            "text": ["a", "b c"],
            "sampling_params": [{"max_new_tokens": 2, **GREEDY}, {"max_new_tokens": 3, **GREEDY}],
        },
    )
    assert r.status_code == 200, r.text
    assert [o["meta_info"]["completion_tokens"] for o in r.json()] == [2, 3]
    r = client.post(
        "/generate", json={"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 2}}
    )
    assert [o["meta_info"]["prompt_tokens"] for o in r.json()] == [3, 2]


def test_generate_stream_is_cumulative(client):
    flush(client)
    body = {"text": "Stream me", "sampling_params": {"max_new_tokens": 8, **GREEDY}}
    full = client.post("/generate", json=body).json()
    flush(client)
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = list(_sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert texts[-1] == full["text"]
    assert chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_generate_batch_stream_has_index(client):
    body = {"text": ["one", "two"], "sampling_params": {"max_new_tokens": 3, **GREEDY}, "stream": True}
    with client.stream("POST", "/generate", json=body) as r:
        chunks = [json.loads(e) for e in _sse_events(r.iter_lines()) if e != "[DONE]"]
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1]
    assert all(len(c["output_ids"]) == 3 for c in finals.values())


def test_generate_with_logprobs(client):
    r = client.post(
        "/generate",
        json={
            "text": "Hi",
            "sampling_params": {"max_new_tokens": 3, **GREEDY},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    )
    out = r.json()
    meta = out["meta_info"]
    assert [tid for _, tid, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
    assert [text for _, _, text in meta["output_token_logprobs"]] == [
        TOKENIZER.decode([t]) for t in out["output_ids"]
    ]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    for (lp, tid, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert top[0][1] == tid and top[0][0] == pytest.approx(
            lp
        )  # greedy: the chosen token is the most likely
        assert top[1][0] <= top[0][0]


def test_info_endpoints(client, server):
    info = client.get("/get_model_info").json()
    assert info["model_path"].endswith("tiny-llama") and info["is_generation"] is True
    sinfo = client.get("/get_server_info").json()
    assert sinfo["max_total_num_tokens"] > 0 and sinfo["port"] == int(server.url.rsplit(":", 1)[1])
    state = sinfo["internal_states"][0]
    for key in ("available_kv_tokens", "max_total_num_tokens", "num_running_reqs", "num_waiting_reqs"):
        assert key in state
    assert client.get("/health_generate").status_code == 200


def test_flush_cache(client):
    client.post("/generate", json={"text": "cache me please", "sampling_params": {"max_new_tokens": 1}})
    wait_idle(client)
    r = client.post("/flush_cache")
    assert r.status_code == 200
    state = internal_state(client)
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert state.get("evictable_kv_tokens", 0) == 0
    again = client.post(
        "/generate", json={"text": "cache me please", "sampling_params": {"max_new_tokens": 1}}
    )
    assert again.json()["meta_info"]["cached_tokens"] == 0


def test_auth(server):
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = httpx.post(f"{server.url}/generate", json={"text": "x"}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == 401
        assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 401
    ok = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


# ---------------------------------------------------------------------------- bad input
LONG_IDS = [5] * 5000  # the tiny model's context is 4096 tokens
BAD_REQUESTS = [
    ("/generate", b'{"text": "hi", '),
    ("/generate", {"text": ""}),
    ("/generate", {"input_ids": []}),
    ("/generate", {"text": 5}),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": "ten"}}),
    ("/generate", {"text": "hi", "sampling_params": {"top_p": 7}}),
    ("/generate", {"text": "hi", "sampling_params": {"no_such_param": 1}}),
    ("/generate", {"input_ids": [1, 100000]}),
    ("/generate", {"input_ids": LONG_IDS}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10_000}}),
    ("/v1/completions", b"not json"),
    ("/v1/completions", {"model": "default", "prompt": ""}),
    ("/v1/completions", {"model": "default", "prompt": []}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": -1}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": "x"}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "n": 100000}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "top_k": 0}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "presence_penalty": 9}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "logprobs": 1000}),
    ("/v1/completions", {"model": "default", "prompt": "hello " * 5000}),
    ("/v1/completions", {"model": "default", "prompt": LONG_IDS}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "stream": True, "temperature": -2}),
    ("/v1/chat/completions", {"model": "default", "messages": []}),
    ("/v1/chat/completions", {"model": "default", "messages": "hi"}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "wizard", "content": "hi"}]}),
    (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "top_p": -1},
    ),
    (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
    ),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi " * 5000}]}),
]


@pytest.mark.parametrize("path,body", BAD_REQUESTS, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BAD_REQUESTS)])
def test_bad_request_is_400(client, path, body):
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_400_as_upstream(client, path):
    body = {"model": "gpt-nope", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    r = client.post(path, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["param"] == "model"
    served = client.get("/v1/models").json()["data"][0]["id"]
    assert err["message"] == f"The model `gpt-nope` does not exist. The served model name is `{served}`."


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field", ["regex", "json_schema", "ebnf"])
def test_invalid_constraints_are_400_naming_the_field(client, path, field):
    value = {"json_schema": {"type": "nope"}, "regex": "a(", "ebnf": "root ::= foo"}[field]
    body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and f"invalid {field}" in err["message"]


def test_server_still_serves_after_bad_requests(client):
    for path, body in BAD_REQUESTS[:5]:
        client.post(path, json=body) if not isinstance(body, bytes) else client.post(path, content=body)
    r = client.post("/generate", json={"text": "still alive?", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
    state = wait_idle(client)
    assert state["num_running_reqs"] == 0


# ---------------------------------------------------------------------------- aborts
LONG_GEN = {"max_new_tokens": 3000, **GREEDY}


def _idle_kv(client) -> int:
    state = wait_idle(client)
    return state["available_kv_tokens"]


def test_client_disconnect_mid_stream_aborts(client, server):
    initial = _idle_kv(client)
    started = time.monotonic()
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        with c.stream(
            "POST", "/generate", json={"text": "go on", "sampling_params": LONG_GEN, "stream": True}
        ) as r:
            events = _sse_events(r.iter_lines())
            for _ in range(3):
                next(events)
            assert internal_state(client)["num_running_reqs"] == 1
        # leaving the block closes the connection mid-stream
    assert wait_until(lambda: internal_state(client)["num_running_reqs"] == 0, 10.0, 0.1)
    assert time.monotonic() - started < 20  # far less than 3000 tokens would take
    assert _idle_kv(client) == initial


def test_openai_stream_disconnect_aborts(client, server):
    initial = _idle_kv(client)
    body = {
        "model": "default",
        "prompt": "go",
        "max_tokens": 3000,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            events = _sse_events(r.iter_lines())
            next(events)
            next(events)
    assert wait_until(lambda: internal_state(client)["num_running_reqs"] == 0, 10.0, 0.1)
    assert _idle_kv(client) == initial


def test_client_timeout_non_streaming_aborts(client, server):
    initial = _idle_kv(client)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/generate",
            json={"text": "x", "sampling_params": LONG_GEN},
            headers=server.headers,
            timeout=1.0,
        )
    assert wait_until(lambda: internal_state(client)["num_running_reqs"] == 0, 10.0, 0.1)
    assert _idle_kv(client) == initial


def test_abort_request_endpoint(client, server):
    rid = "abort-me-123"
    body = {"text": "abort", "sampling_params": LONG_GEN, "rid": rid, "stream": True}
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        with c.stream("POST", "/generate", json=body) as r:
            events = _sse_events(r.iter_lines())
            next(events)
            assert client.post("/abort_request", json={"rid": rid}).status_code == 200
            rest = [e for e in events]
    assert rest[-1] == "[DONE]"
    last = json.loads(rest[-2])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 3000
    wait_idle(client)


# ---------------------------------------------------------------------------- life cycle
@pytest.mark.slow  # its own server, stopped by a signal
def test_sigterm_stops_all_children():
    handle = launch_server(("--disable-radix-cache",))
    children = child_pids(handle.proc.pid)
    assert len(children) >= 2  # scheduler + detokenizer (+ multiprocessing's resource tracker)
    handle.proc.send_signal(signal.SIGTERM)
    handle.proc.wait(timeout=30)
    assert wait_until(lambda: not any(pid_alive(p) for p in children), 10.0)


@pytest.mark.slow  # its own server, stopped by a signal
def test_killing_scheduler_makes_server_exit():
    handle = launch_server()
    children = child_pids(handle.proc.pid)
    scheduler = None
    for pid in children:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "sglang-rank0":
                scheduler = pid
    assert scheduler is not None
    os.kill(scheduler, signal.SIGKILL)
    try:
        code = handle.proc.wait(timeout=30)
    finally:
        handle.stop()
    assert code != 0
    assert wait_until(lambda: not any(pid_alive(p) for p in children), 10.0)
    assert "exited unexpectedly" in handle.log()


@pytest.mark.slow  # its own server, stopped by a signal
def test_children_exit_when_server_is_killed():
    handle = launch_server(("--disable-radix-cache",))
    children = child_pids(handle.proc.pid)
    handle.proc.kill()  # SIGKILL: no chance to clean up; the children must notice on their own
    handle.proc.wait(timeout=10)
    assert wait_until(lambda: not any(pid_alive(p) for p in children), 15.0)
